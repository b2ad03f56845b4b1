"""Network slots and restore fidelity with real VMs: every restored guest rejoins the world before it is ready.

All test traffic stays on this machine: between the host and the slot namespaces the server creates, and a
stand-in "outside" namespace the test creates itself.
"""

from __future__ import annotations

import json
import secrets
import shlex
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.netutil import REACH_S, Listener, outside_network, probe
from tests.support.serve import Client, cli

GUEST_PROBE = (
    "python3 -c 'import socket, sys\n"
    "s = socket.socket(); s.settimeout(3)\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); g = s.recv(2)\n"
    '    print("ok", g.decode()) if g else print("blocked")\n'
    "except OSError as e:\n"
    '    print("blocked", type(e).__name__)\' {addr} {port}'
)
# Probes every ADDR:PORT given at once (one thread each), printing "ADDR:PORT ok <greeting>" or
# "ADDR:PORT blocked <error>": a denied connect costs its 3 s timeout once for all targets, not once per target.
# A failed connect is blocked, and so is a connection reset or closed before the greeting every listener here sends:
# the egress proxy accepts every connection of the guest, then resets the ones its policy denies.
GUEST_PROBES = """\
import concurrent.futures, socket, sys

def probe(target):
    addr, port = target.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(3)
        try:
            s.connect((addr, int(port)))
        except OSError as e:
            return "blocked " + type(e).__name__
        try:
            greeting = s.recv(2)
        except ConnectionResetError:
            return "blocked reset"
        except OSError as e:
            return "ok (no greeting: " + type(e).__name__ + ")"
        return "ok " + greeting.decode() if greeting else "blocked closed"

with concurrent.futures.ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    for target, outcome in zip(sys.argv[1:], pool.map(probe, sys.argv[1:])):
        print(target, outcome)
"""


def guest_server(port: int) -> str:
    """Start a TCP server in the guest on ``port`` (all addresses) that greets with b"hi" and echoes one read, and
    wait until it listens. Plain sockets: ``python3 -m http.server`` takes ~12 s to import under TCG."""
    return (
        "nohup python3 -c 'import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f's.bind(("0.0.0.0", {port})); s.listen(16)\n'
        "while True:\n"
        "    c, _ = s.accept(); c.settimeout(10)\n"
        "    try:\n"
        '        c.sendall(b"hi"); c.sendall(c.recv(64))\n'
        "    except OSError:\n"
        "        pass\n"
        "    c.close()\n"
        "' >/dev/null 2>&1 & "
        f"for i in $(seq 300); do grep -q ':{port:04X} ' /proc/net/tcp && break; sleep 0.1; done"
    )


HOOKS = """
from cryobox_guest import on_resume

def make(order):
    def hook(ctx):
        with open("/root/hooks.log", "a") as log:
            log.write(f"{order} {ctx['instance_id']}\\n")
    return hook

for order in ("readiness", "connections", "identity", "names", "clock"):
    on_resume(make(order), order=order, name=f"log-{order}")
"""


def _host_ip(slot_address: str) -> str:
    """The host end of a slot's /30 (the slot address is .2)."""
    a, b, c, d = (int(x) for x in slot_address.split("."))
    return f"{a}.{b}.{c}.{d - 1}"


def test_two_sandboxes_get_different_slots_and_the_same_identity(client: Client) -> None:
    first, second = client.create(), client.create()
    assert first["guest_ip"] and second["guest_ip"] and first["guest_ip"] != second["guest_ip"]
    assert first["instance_id"] and second["instance_id"] and first["instance_id"] != second["instance_id"]
    views = [client.call("GET", f"/v1/sandboxes/{s['id']}/net") for s in (first, second)]
    for sandbox, view in zip((first, second), views, strict=True):
        eth0 = next(i for i in view["interfaces"] if i["name"] == "eth0")
        assert eth0["mac"] == "02:cb:00:00:00:02"
        assert "172.16.0.2/30" in eth0["addresses"]
        assert view["instance_id"] == sandbox["instance_id"]
        assert client.sh(sandbox["id"], "cat /run/cryobox/instance-id") == sandbox["instance_id"] + "\n"


def test_host_reaches_a_guest_server_through_its_slot(client: Client) -> None:
    sandbox = client.create()
    client.sh(sandbox["id"], guest_server(8080))
    with socket.create_connection((sandbox["guest_ip"], 8080), timeout=10) as conn:
        assert conn.recv(2) == b"hi"  # the guest's server answers
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"  # and hears the host


def test_guests_cannot_reach_each_other_or_the_host(server: ServeProcess, client: Client) -> None:
    victim, attacker = client.create(), client.create()
    client.sh(victim["id"], guest_server(8081))
    with socket.create_connection((victim["guest_ip"], 8081), timeout=10) as conn:  # the host can reach it
        assert conn.recv(2) == b"hi"
    host_listener = Listener(None, "0.0.0.0")  # a host service on every address
    try:
        api_port = int(server.url.rsplit(":", 1)[1])
        targets = [
            (victim["guest_ip"], 8081),  # another guest, at its slot address
            (_host_ip(attacker["guest_ip"]), host_listener.port),  # the host, through the own gateway
            (_host_ip(attacker["guest_ip"]), api_port),  # the API port on that address
            (_host_ip(victim["guest_ip"]), host_listener.port),
        ]
        wanted = [f"{addr}:{port}" for addr, port in targets]
        out = client.sh(attacker["id"], " ".join(["python3 -c", shlex.quote(GUEST_PROBES), *wanted]), timeout=30)
        outcomes = dict(line.split(" ", 1) for line in out.splitlines())
        assert sorted(outcomes) == sorted(wanted), out
        for target in wanted:
            assert outcomes[target].startswith("blocked"), (target, out)
    finally:
        host_listener.close()


@pytest.fixture
def outside() -> Iterator[tuple[str, str, str]]:
    """A stand-in for the internet: a namespace of the test's own behind a veth from the host."""
    tag = secrets.token_hex(3)
    with outside_network(tag) as (cidr, server_ip):
        yield cidr, server_ip, f"cryobox-{tag}-out"


def test_egress_is_denied_by_default_and_allowed_when_asked(client: Client, outside: tuple[str, str, str]) -> None:
    cidr, server_ip, name = outside
    listener = Listener(name, server_ip)  # listens inside the outside namespace
    try:
        closed = client.create()
        out = client.sh(closed["id"], GUEST_PROBE.format(addr=server_ip, port=listener.port), timeout=30)
        assert out.startswith("blocked"), out
        opened = client.create(network={"egress": "allow", "allow": [cidr]})
        out = client.sh(opened["id"], GUEST_PROBE.format(addr=server_ip, port=listener.port), timeout=30)
        assert out == "ok hi\n", out
        client.call(
            "POST", "/v1/sandboxes", 400, json={"template": "base", "network": {"egress": "allow", "allow": ["nope"]}}
        )
    finally:
        listener.close()


def test_private_and_metadata_addresses_stay_refused_even_with_egress_allowed_everywhere(client: Client) -> None:
    """The deny list comes before any grant: with ``allow: 0.0.0.0/0`` a guest reaches the (operator-exempted)
    stand-in for the internet, but neither a cloud metadata address nor an RFC 1918 network the host can reach."""
    tags = [secrets.token_hex(3) for _ in range(3)]
    with (
        outside_network(tags[0]) as (_, public_ip),
        outside_network(tags[1], "169.254.169.252/30") as (_, metadata_ip),
        outside_network(tags[2], f"10.198.{secrets.randbelow(256)}.0/30") as (_, lan_ip),
    ):
        assert metadata_ip == "169.254.169.254"
        ips = (public_ip, metadata_ip, lan_ip)
        listeners = [Listener(f"cryobox-{tag}-out", ip) for tag, ip in zip(tags, ips, strict=True)]
        try:
            for listener, ip in zip(listeners, ips, strict=True):
                # the host itself reaches every one of them
                assert probe(None, ip, listener.port, timeout=REACH_S) == "ok", ip
            sbx = client.create(network={"egress": "allow", "allow": ["0.0.0.0/0"]})
            wanted = [f"{ip}:{lst.port}" for ip, lst in zip(ips, listeners, strict=True)]
            out = client.sh(sbx["id"], " ".join(["python3 -c", shlex.quote(GUEST_PROBES), *wanted]), timeout=30)
            outcomes = dict(line.split(" ", 1) for line in out.splitlines())
            assert outcomes[wanted[0]].startswith("ok"), out  # the grant works...
            assert outcomes[wanted[1]].startswith("blocked"), out  # ...but not for the metadata service
            assert outcomes[wanted[2]].startswith("blocked"), out  # ...nor for a private network
        finally:
            for listener in listeners:
                listener.close()


CLOCK_BEHIND_S = 90  # the guest clock is stepped this far back before the snapshot


def _guest_clock_error_ms(client: Client, sandbox_id: str) -> float:
    before = time.time_ns()
    view = client.call("GET", f"/v1/sandboxes/{sandbox_id}/net")
    after = time.time_ns()
    guest = int(view["clock"]["realtime_ns"])
    if guest < before:
        return (before - guest) / 1e6
    if guest > after:
        return (guest - after) / 1e6
    return 0.0


def test_clock_after_restoring_a_minute_old_snapshot(client: Client) -> None:
    """A snapshot whose guest clock is 90 s behind the host's, as it would be when restored that long after it was
    taken (without waiting for that): the restore must step the guest's wall clock to the host's."""
    source = client.create()
    client.sh(source["id"], f"date -s @$(( $(date +%s) - {CLOCK_BEHIND_S} )) >/dev/null")
    behind = _guest_clock_error_ms(client, source["id"])
    assert behind >= (CLOCK_BEHIND_S - 5) * 1000, behind  # the snapshot really carries a wrong clock
    snap = client.snapshot(source["id"])
    restored = client.create(from_snapshot=snap["id"])
    first = _guest_clock_error_ms(client, restored["id"])  # wide window: the guest's inspect code runs cold
    time.sleep(2)
    second = _guest_clock_error_ms(client, restored["id"])  # and it keeps time (no drift after the step)
    print(
        f"\nguest clock vs host after restoring a snapshot {behind / 1000:.1f} s behind: "
        f"{first:.1f} / {second:.1f} ms outside"
    )
    assert first < 50 and second < 50


# Fork-tree children's distinct entropy, instance ids and addresses: checked by server/test_snapshots.py's fork-tree
# test, on the 16 children it already makes.


def test_resume_hooks_run_once_per_restore_in_order(client: Client) -> None:
    source = client.create()
    client.call(
        "PUT", f"/v1/sandboxes/{source['id']}/fs", params={"path": "/etc/cryobox/resume.d/log.py"}, content=HOOKS
    )
    snap = client.snapshot(source["id"])
    restored = client.create(from_snapshot=snap["id"])
    order = ["clock", "names", "identity", "connections", "readiness"]
    log = client.sh(restored["id"], "cat /root/hooks.log").splitlines()
    assert log == [f"{o} {restored['instance_id']}" for o in order]
    client.call("POST", f"/v1/sandboxes/{restored['id']}/pause", 204)
    client.call("POST", f"/v1/sandboxes/{restored['id']}/resume", 204)
    log = client.sh(restored["id"], "cat /root/hooks.log").splitlines()
    assert log == [f"{o} {restored['instance_id']}" for o in order] * 2  # once more for the resume

    client.sh(
        source["id"],
        "printf 'from cryobox_guest import on_resume\\n"
        'def bad(ctx):\\n    raise RuntimeError("db not reachable")\\n'
        'on_resume(bad, order="connections", name="reconnect-db")\\n\' > /etc/cryobox/resume.d/bad.py',
    )
    broken = client.snapshot(source["id"])
    failed = client.call("POST", "/v1/sandboxes", 424, json={"from_snapshot": broken["id"]})
    assert failed["code"] == "resume_hook_failed"
    assert "reconnect-db" in failed["error"] and "db not reachable" in failed["error"]


def test_inspect_net_cli(server: ServeProcess, client: Client) -> None:
    sandbox = client.create()
    env = {"CRYOBOX_API_URL": server.url, "CRYOBOX_API_KEY": server.api_key}
    done = cli("inspect", "net", sandbox["id"], "--json", env=env)
    assert done.returncode == 0, done.stderr
    view: dict[str, Any] = json.loads(done.stdout)
    assert view["instance_id"] == sandbox["instance_id"] and view["resolv_conf"]
    table = cli("inspect", "net", sandbox["id"], env=env)
    assert table.returncode == 0 and "instance id" in table.stdout


def test_bake_refuses_with_an_open_connection(client: Client) -> None:
    name = f"tcp-{secrets.token_hex(3)}"
    warmup = (
        "nohup python3 -c 'import socket, time\n"
        's = socket.socket(); s.bind(("127.0.0.1", 7001)); s.listen()\n'
        'c = socket.create_connection(("127.0.0.1", 7001)); a, _ = s.accept(); time.sleep(3600)\' '
        ">/dev/null 2>&1 & "
        "for i in $(seq 300); do awk '$4 == \"01\"' /proc/net/tcp | grep -q . && break; sleep 0.1; done"
    )
    client.call("POST", "/v1/templates", 202, json={"name": name, "base": "base", "warmup": [warmup]})
    try:
        deadline = time.monotonic() + 600
        while True:
            template = client.call("GET", f"/v1/templates/{name}")
            if template["status"] != "building" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert template["status"] == "error"
        assert "established TCP" in template["error"] and "127.0.0.1:7001" in template["error"]
    finally:
        client.http.delete(f"/v1/templates/{name}")


def test_sandbox_network_survives_nothing_after_stop(
    tmp_path_factory: Any, cache_dir: Path, templates: dict[str, Template]
) -> None:
    """A server's slots, namespaces and firewall table are gone once it stops (and reclaimed after a crash)."""
    from cryobox.agent.net.netlink import list_tagged
    from cryobox.agent.net.slots import tag_for

    data_dir = tmp_path_factory.mktemp("netstop")
    small = ["--templates", "base", "--net-pool", "2"]  # one template, two slots: a cheaper start-up
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=1, extra_args=small) as srv:
        client = Client(srv.url, srv.api_key)
        client.create()
        tag = tag_for(data_dir)
        assert list_tagged(tag).netns
        client.http.close()
    tagged = list_tagged(tag)
    assert tagged.netns == [] and tagged.links == []
