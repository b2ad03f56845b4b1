"""``cryobox bench net``, egress section: what host-side egress enforcement costs a guest's TCP, against plain
kernel routing, measured side by side in one run, with no VM. The mode measured is the agents' own
(``CRYOBOX_EGRESS_MODE``: ``forward``, the default — the egress gate decides, the kernel forwards; ``proxy`` —
the egress proxy carries every connection); the result names it (``egress_mode``).

* A "server" namespace ``cryobox-<tag>-srv`` behind a veth from the host, on a free ``/30`` of ``10.199.0.0/16``,
  runs :mod:`.egress_peer`'s servers (a process of its own): greeting + echo, bulk, HTTP, and a name server
  answering ``bench.example`` (the proxy resolves names through it, as through any upstream).
* proxied: a real slot (:func:`~cryobox.agent.net.create_slot`, tag and a free ``10.23x.0.0/16``) whose tap is
  replaced by a veth to a fake guest namespace carrying the baked guest identity (as the egress integration tests
  do), and an :class:`~cryobox.agent.net.egress.service.EgressService` on this bench's event loop attached to it:
  allow the server's ``/30`` for raw TCP, allow ``bench.example`` for HTTP; the floor exempts only that ``/30``.
* direct: a second guest namespace ``cryobox-<tag>-dir`` on a plain veth (not a ``cb*`` slot link, so no cryobox
  host table applies) routed to the server by the host kernel (``net.ipv4.ip_forward`` 1, restored afterwards).

The client runs in a process of its own (:mod:`.egress_peer`) that enters both guest namespaces and alternates
the paths connection by connection; then once more on a thread of this process, to show what sharing the GIL
with the proxy would do to the figures. Everything carries the tag, is removed in ``finally`` and checked gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..util.progress import Reporter
from ..util.system import in_fresh_thread
from .egress_peer import run_client, setns
from .egress_result import EgressSamples
from .fakeguest import attach_fake_guest
from .snapshot_report import BenchError

SANDBOX = "sb-bench-egress"
BENCH_NAME = "bench.example"
ECHO_PORT, BULK_PORT, HTTP_PORT, DNS_PORT = 7001, 7002, 80, 53
CONNECTS = 300
HTTP_REQUESTS = 200
BULK_RUNS = 3
MIN_BULK_BYTES = 2 * 2**30
MAX_BULK_BYTES = 16 * 2**30
MIN_BULK_SECONDS = 3.0
IN_PROCESS_CONNECTS = 150
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
NETNS_DIR = Path("/run/netns")


@dataclass(frozen=True)
class Rig:
    """Names and addresses of everything the section builds (all carrying ``tag``)."""

    tag: str
    k: int
    slot_cidr: str

    @property
    def server_net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.199.{self.k}.0/30")

    @property
    def server_ip(self) -> str:
        return f"10.199.{self.k}.2"

    @property
    def server_ns(self) -> str:
        return f"cryobox-{self.tag}-srv"

    @property
    def direct_ns(self) -> str:
        return f"cryobox-{self.tag}-dir"

    @property
    def links(self) -> tuple[str, str]:
        """The host ends of the server's and the direct guest's veths (``x*``: no cryobox table matches them)."""
        return f"xs{self.tag}", f"xd{self.tag}"


def pick_rig(taken: list[ipaddress.IPv4Network], tag: str) -> Rig:
    """A random free ``10.199.<k>.0/29`` (server ``/30``, direct guest ``/30``) and a free ``10.23x.0.0/16``."""
    ks = [k for k in range(256) if not any(ipaddress.IPv4Network(f"10.199.{k}.0/29").overlaps(n) for n in taken)]
    cidrs = [
        c
        for c in (f"10.{n}.0.0/16" for n in range(230, 240))
        if not any(ipaddress.IPv4Network(c).overlaps(t) for t in taken)
    ]
    if not ks or not cidrs:
        raise BenchError("egress: no free 10.199.<k>.0/29 or 10.23x.0.0/16 on this host")
    return Rig(tag, random.choice(ks), random.choice(cidrs))


# --- namespaces (blocking: run on a worker thread) ----------------------------------------------------------------


def _in_ns(name: str, fn: Any) -> None:
    def inside() -> None:
        setns(str(NETNS_DIR / name))
        fn()

    in_fresh_thread(inside, name="cryobox-bench-egress")


def _linked_ns(name: str, link: str, host_ip: str, inner_ip: str) -> None:
    """Namespace ``name`` with ``eth0`` (``inner_ip``/30, default route via the host) paired with host ``link``."""
    from pyroute2 import IPRoute, netns

    netns.create(name)
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=link, kind="veth", peer={"ifname": "eth0", "net_ns_fd": fd})
            idx = ipr.link_lookup(ifname=link)[0]
            ipr.addr("add", index=idx, address=host_ip, prefixlen=30)
            ipr.link("set", index=idx, state="up")
    finally:
        os.close(fd)

    def inside() -> None:
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            idx = ipr.link_lookup(ifname="eth0")[0]
            ipr.addr("add", index=idx, address=inner_ip, prefixlen=30)
            ipr.link("set", index=idx, state="up")
            ipr.route("add", dst="0.0.0.0/0", gateway=host_ip)

    _in_ns(name, inside)


def _remove(rig: Rig) -> None:
    """Delete everything ``rig`` may have built (idempotent)."""
    from pyroute2 import IPRoute, netns

    from ..agent.net import SlotPlan
    from ..agent.net.netlink import destroy_slot, reclaim

    slot = SlotPlan(rig.tag, rig.slot_cidr).slot(0)
    with IPRoute() as ipr:
        for link in rig.links:
            for idx in ipr.link_lookup(ifname=link):
                ipr.link("del", index=idx)
    for name in (rig.server_ns, rig.direct_ns, f"{slot.netns}g"):
        if (NETNS_DIR / name).exists():
            netns.remove(name)
    destroy_slot(slot)
    reclaim(rig.tag)  # whatever else carries the tag


def _leftovers(rig: Rig) -> list[str]:
    from pyroute2 import IPRoute

    from ..agent.net.netlink import list_tagged

    tagged = list_tagged(rig.tag)
    with IPRoute() as ipr:
        links = [link for link in rig.links if ipr.link_lookup(ifname=link)]
    return [*tagged.netns, *tagged.links, *links]


@contextlib.contextmanager
def ip_forward_on() -> Iterator[str]:
    """The host forwards IPv4 (the direct path needs it) until the end; its previous value is put back."""
    was = IP_FORWARD.read_text().strip()
    IP_FORWARD.write_text("1")
    try:
        yield was
    finally:
        IP_FORWARD.write_text(was)


# --- processes ---------------------------------------------------------------------------------------------------


def _peer_argv(role: str, spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "cryobox.bench.egress_peer", role, json.dumps(spec)]


def _peer_env() -> dict[str, str]:
    """This process's environment, with its import path (``cryobox`` may come from a source tree)."""
    src = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}


async def _start_server(rig: Rig) -> asyncio.subprocess.Process:
    spec = {
        "netns": str(NETNS_DIR / rig.server_ns),
        "ip": rig.server_ip,
        "echo_port": ECHO_PORT,
        "bulk_port": BULK_PORT,
        "http_port": HTTP_PORT,
        "dns_port": DNS_PORT,
        "dns_name": BENCH_NAME,
    }
    proc = await asyncio.create_subprocess_exec(
        *_peer_argv("serve", spec), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=_peer_env()
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    if line.strip() != b"ready":
        await _stop(proc)
        raise BenchError(f"egress: the bench server did not start (exit {proc.returncode})")
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _client(spec: dict[str, Any], *, in_process: bool = False) -> dict[str, Any]:
    """The client's task ``spec``: in a process of its own, or on a fresh thread of this one."""
    if in_process:
        return await asyncio.to_thread(in_fresh_thread, lambda: run_client(spec), name="cryobox-bench-client")
    proc = await asyncio.create_subprocess_exec(
        *_peer_argv("client", spec), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_peer_env()
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise BenchError(f"egress client {spec['task']} failed (exit {proc.returncode}): {err.decode()[-800:]}")
    result: dict[str, Any] = json.loads(out)
    return result


# --- the section -------------------------------------------------------------------------------------------------


async def measure_egress(
    s: EgressSamples,
    console: Console,
    progress: Reporter,
    *,
    connects: int = CONNECTS,
    requests: int = HTTP_REQUESTS,
    bulk_runs: int = BULK_RUNS,
    in_process: bool = True,
) -> None:
    """The egress section: builds the rig, measures, removes everything carrying its tag and checks it gone."""
    from ..agent.net import SlotPlan, create_slot
    from ..agent.net.denylist import deny_networks
    from ..agent.net.egress.metrics import EgressMetrics
    from ..agent.net.egress.proxy import ProxyEnv
    from ..agent.net.egress.resolver import Resolver, Upstream
    from ..agent.net.egress.service import EgressService
    from ..agent.net.firewall import Firewall
    from ..agent.net.netlink import host_networks
    from ..agent.net.slots import egress_mode_from_env
    from ..netpolicy import EgressPolicy

    rig = pick_rig(await asyncio.to_thread(host_networks), secrets.token_hex(3))
    s.server_cidr, s.slot_cidr = str(rig.server_net), rig.slot_cidr
    plan = SlotPlan(rig.tag, rig.slot_cidr, egress=egress_mode_from_env())
    slot, s.mode = plan.slot(0), plan.egress
    floor = deny_networks(exceptions=[rig.server_net])
    firewall = Firewall(plan, floor=floor)  # forward mode: the host routes the slot's decided connections
    console.print(f"egress: mode {plan.egress}, tag {rig.tag}, server {rig.server_net}, slot CIDR {rig.slot_cidr}")
    raw_policy = EgressPolicy(allow=[str(rig.server_net)])
    metrics = EgressMetrics()
    env = ProxyEnv(
        Resolver(Upstream(rig.server_ip, DNS_PORT)),
        floor=floor,
        observer=metrics,
    )
    service = EgressService(env, metrics=metrics, mode=plan.egress)
    server: asyncio.subprocess.Process | None = None
    try:
        with ip_forward_on() as was:
            s.ip_forward_was = was
            try:
                await asyncio.to_thread(firewall.ensure, fresh=True)
                await asyncio.to_thread(_build, rig, slot, create_slot)
                server = await _start_server(rig)
                await service.attach(SANDBOX, slot.netns, raw_policy)
                paths = {"direct": str(NETNS_DIR / rig.direct_ns), "proxied": str(NETNS_DIR / f"{slot.netns}g")}
                base = {"paths": paths, "ip": rig.server_ip}
                with progress.phase("egress: connect, HTTP, throughput (direct and proxied)", 4) as phase:
                    got = await _client({**base, "task": "connect", "port": ECHO_PORT, "rounds": connects})
                    s.connect_ms = {p: got[p] for p in ("direct", "proxied")}
                    phase.advance()
                    service.update(SANDBOX, EgressPolicy(allow=[BENCH_NAME]))
                    got = await _client(
                        {**base, "task": "http", "port": HTTP_PORT, "host": BENCH_NAME, "rounds": requests}
                    )
                    s.http_ms = {p: got[p] for p in ("direct", "proxied")}
                    phase.advance()
                    service.update(SANDBOX, raw_policy)
                    bulk = {
                        **base,
                        "task": "bulk",
                        "port": BULK_PORT,
                        "rounds": bulk_runs,
                        "size": 0,
                        "min_bytes": MIN_BULK_BYTES,
                        "max_bytes": MAX_BULK_BYTES,
                        "min_seconds": MIN_BULK_SECONDS,
                    }
                    got = await _client(bulk)
                    s.throughput_mbps, s.bulk_bytes = {p: got[p] for p in ("direct", "proxied")}, int(got["bytes"])
                    phase.advance()
                    if in_process:
                        got = await _client(
                            {**base, "task": "connect", "port": ECHO_PORT, "rounds": IN_PROCESS_CONNECTS},
                            in_process=True,
                        )
                        s.in_process_connect_ms = {p: got[p] for p in ("direct", "proxied")}
                        got = await _client({**bulk, "rounds": 1, "size": s.bulk_bytes}, in_process=True)
                        s.in_process_throughput_mbps = {p: got[p] for p in ("direct", "proxied")}
                        s.in_process_bulk_bytes = int(got["bytes"])
                    phase.advance()
                s.proxied_connections = _allowed(metrics)
            finally:
                try:
                    await service.close()
                    if server is not None:
                        await _stop(server)
                finally:
                    await asyncio.to_thread(_remove, rig)
                    await asyncio.to_thread(firewall.remove)
    finally:
        left = await asyncio.to_thread(_leftovers, rig)
        if left:
            raise BenchError(f"egress: network objects tagged {rig.tag} left behind: {left}")


def _allowed(metrics: Any) -> int:
    """Connections the proxy allowed (its counters: the decision log keeps only the latest)."""
    return int(
        sum(
            metrics.registry.get_sample_value(
                "cryobox_egress_decisions_total", {"decision": "allowed", "reason": reason}
            )
            or 0
            for reason in ("allow-cidr", "allow-name")
        )
    )


def _build(rig: Rig, slot: Any, create_slot: Any) -> None:
    base = rig.server_net.network_address
    _linked_ns(rig.server_ns, rig.links[0], str(base + 1), str(base + 2))
    _linked_ns(rig.direct_ns, rig.links[1], str(base + 5), str(base + 6))
    create_slot(slot)
    attach_fake_guest(slot)
