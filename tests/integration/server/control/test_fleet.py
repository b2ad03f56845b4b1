"""A real fleet on this machine: PostgreSQL, an S3 server (moto), ``cryobox control`` (two replicas for the
burst) and three ``cryobox agent`` processes, each in its own network namespace with its own address, with
separate data dirs, slot networks and memory servers; the agents fetch the template from the store.

Proved here: a burst spreads over all three by reservation (each agent takes exactly its capacity, the excess
is refused, through two control-plane replicas sharing one database; a replica's ``/metrics`` shows each agent's
memory-server counters and their sum); a snapshot taken on one agent restores
by id on another; a fork_tree lands on several agents; a SIGKILLed agent's sandboxes turn ``lost`` within the
deadline while creates keep succeeding elsewhere; its restart changes no row of another host; a restarted
control plane loses nothing; a bad node token is refused and changes nothing; a drained agent's sandboxes wake
on the other agents as the same sandboxes (files, processes, identity, settings), through the object store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cryobox.agent.templates.bake import Template
from cryobox.bench.fleetproc import S3_CREDENTIALS, ControlProcess, Fleet
from cryobox.objstore.client import open_store
from cryobox.registry import Registry
from cryobox.util.sealing import Sealer
from tests.support.e2b import run_app
from tests.support.sdnotify import NotifySocket, notify_socket

DEADLINE_S = 4.0
CAPACITY = 3  # sandboxes per agent
RESERVATION_TTL_S = 20  # how long a dead control plane's reservations (and so its strays) live


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    with Fleet(
        root,
        agents=3,
        cache_dir=cache_dir,
        isolation="netns",
        template_source="store",
        memory="lazy",
        max_sandboxes=CAPACITY,
        agent_deadline_s=DEADLINE_S,
        heartbeat_interval_s=1.0,
        control_env={"CRYOBOX_RESERVATION_TTL_S": str(RESERVATION_TTL_S)},
    ) as started:
        yield started
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert "cbxfleet-" not in namespaces, namespaces
    qemus = subprocess.run(["pgrep", "-f", f"qemu-system.*{root}"], capture_output=True, text=True).stdout
    assert qemus == "", f"QEMU processes of the fleet left behind: {qemus}"


class Api:
    def __init__(self, url: str, key: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300, trust_env=False)

    def call(self, method: str, path: str, status: int = 200, **kw: Any) -> Any:
        response = self.http.request(method, path, **kw)
        assert response.status_code == status, f"{method} {path}: {response.status_code} {response.text}"
        return response.json() if response.content else None

    def create(self, **body: Any) -> dict[str, Any]:
        created: dict[str, Any] = self.call("POST", "/v1/sandboxes", 201, json={"template": "base", **body})
        return created

    def sh(self, sandbox_id: str, cmd: str) -> str:
        result = self.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd, "timeout_seconds": 120})
        assert result["exit_code"] == 0, result
        out: str = result["stdout"]
        return out

    def status(self, sandbox_id: str) -> str:
        return str(self.call("GET", f"/v1/sandboxes/{sandbox_id}")["status"])

    def delete_all(self) -> None:
        for sandbox in self.call("GET", "/v1/sandboxes")["items"]:
            self.http.delete(f"/v1/sandboxes/{sandbox['id']}")

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()


def api(fleet: Fleet, url: str | None = None) -> Api:
    return Api(url or fleet.url, fleet.api_key)


def rows_of_other_hosts(fleet: Fleet, host: str) -> dict[str, dict[str, Any]]:
    assert fleet.postgres is not None
    with Registry(fleet.postgres.url, Sealer.from_keys(fleet.secret_key)) as registry:
        sandboxes = {f"sb:{r.id}": asdict(r) for r in registry.list_sandboxes() if r.host != host}
        snapshots = {f"snap:{r.id}": asdict(r) for r in registry.list_snapshots() if r.host != host}
    return {**sandboxes, **snapshots}


def wait_for(what: str, check: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what} did not happen within {timeout_s}s"
        time.sleep(0.2)
    return time.monotonic() - started


def herd_faults(text: str) -> dict[str, float]:
    """``cryobox_agent_faults_total`` by agent, and the fleet's sum under ``""``, of a control plane's scrape."""
    return {
        sample.labels.get("agent", ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in ("cryobox_agent_faults_total", "cryobox_fleet_faults_total")
    }


def test_burst_spreads_by_reservation_across_agents_and_replicas(fleet: Fleet, cache_dir: Path) -> None:
    assert fleet.postgres is not None
    with notify_socket(fleet.root / "control-2.notify") as notes:  # systemd's, as cryobox-control.service has it
        second = ControlProcess(
            fleet.root / "control-2",
            database_url=fleet.postgres.url,
            node_token=fleet.node_token,
            api_key=fleet.api_key,
            secret_key=fleet.secret_key,
            store_url=fleet.store_url,
            cache_dir=cache_dir,
            agent_deadline_s=DEADLINE_S,
            extra_env={"NOTIFY_SOCKET": str(notes.path)},
        ).start()
        replicas_check(fleet, second, notes)


def replicas_check(fleet: Fleet, second: ControlProcess, notes: NotifySocket) -> None:
    replicas = [fleet.url, second.url]
    first = api(fleet)
    headers = {"Authorization": f"Bearer {fleet.api_key}"}
    burst = 3 * CAPACITY + 2
    try:
        notes.wait_for("READY=1", second.pid)  # once it serves, from the main process (NotifyAccess=main)
        assert set(second.agents()) == {"a0", "a1", "a2"}  # the second replica knows the fleet from the registry

        def create(i: int) -> httpx.Response:
            url = replicas[i % 2]
            return httpx.post(f"{url}/v1/sandboxes", json={"template": "base"}, headers=headers, timeout=600)

        with ThreadPoolExecutor(burst) as pool:
            results = list(pool.map(create, range(burst)))
        created = [r.json() for r in results if r.status_code == 201]
        refused = [r for r in results if r.status_code == 503]
        assert len(created) == 3 * CAPACITY and len(refused) == 2, [r.status_code for r in results]
        assert all(r.json()["code"] == "capacity" and int(r.headers["Retry-After"]) >= 1 for r in refused)
        # exactly each agent's capacity: decided by reservations across both replicas, never overbooked
        assert Counter(s["host"] for s in created) == {"a0": CAPACITY, "a1": CAPACITY, "a2": CAPACITY}
        with api(fleet, second.url) as other:
            for index, sandbox in enumerate(created):  # routed by the row to its agent, from either replica
                assert (other if index % 2 else first).sh(sandbox["id"], "echo ok") == "ok\n"
        # a replica's scrape shows every agent's memory server (gathered from the agents), each counted once
        faults: dict[str, float] = {}

        def gathered() -> bool:  # an agent busy past the gather's 1 s shows up at a later scrape
            faults.clear()
            faults.update(
                herd_faults(httpx.get(f"{second.url}/metrics", headers=headers, timeout=30, trust_env=False).text)
            )
            return {"a0", "a1", "a2"} <= set(faults)

        wait_for("every agent's counters in the replica's scrape", gathered, 30)
        assert set(faults) == {"a0", "a1", "a2", ""} and all(faults[a] > 0 for a in ("a0", "a1", "a2")), faults
        assert faults[""] == faults["a0"] + faults["a1"] + faults["a2"], faults
    finally:
        try:
            first.delete_all()
        finally:  # a failure above keeps this frame (and an unclosed client's socket) until a later test's GC
            first.http.close()
            pid = second.pid
            stopped = second.stop()
            second.cleanup()
    assert stopped == 0  # a clean stop (its interpreter's finalization skipped: os._exit)
    notes.wait_for("STOPPING=1", pid)
    with api(fleet) as after:
        assert after.call("GET", "/v1/sandboxes")["items"] == []


def test_snapshot_restores_elsewhere_lost_agent_fork_tree_and_restart(fleet: Fleet) -> None:
    with api(fleet) as client:
        scenario(fleet, client)


def scenario(fleet: Fleet, client: Api) -> None:
    try:
        parent = client.create()
        home = parent["host"]
        marker = client.sh(parent["id"], "head -c6 /dev/urandom | od -An -tx1 | tr -d ' \\n' | tee /root/marker")
        snap = client.call("POST", f"/v1/sandboxes/{parent['id']}/snapshots", 201, json={})
        assert snap["host"] == home
        wait_for(
            "the snapshot reaching the store",
            lambda: client.call("GET", f"/v1/snapshots/{snap['id']}")["location"] == "stored",
            180,
        )

        # the agent holding both is SIGKILLed: its sandbox turns lost within the deadline
        fleet.kill_agent(home)
        took = wait_for("the parent turning lost", lambda: client.status(parent["id"]) == "lost", DEADLINE_S + 10)
        assert took <= DEADLINE_S + 5
        gone = client.http.post(f"/v1/sandboxes/{parent['id']}/exec", json={"cmd": "true"})
        assert gone.status_code == 409 and gone.json()["details"]["state"] == "lost"
        assert client.call("GET", "/v1/sandboxes", params={"status": "lost"})["items"][0]["id"] == parent["id"]

        # creates keep succeeding on the others, and the snapshot restores by id on another agent
        restored = client.create(from_snapshot=snap["id"])
        assert restored["host"] not in (home, None)
        assert client.sh(restored["id"], "cat /root/marker") == marker

        # fork_tree from there: its agent has room for two more, the third child lands on the other agent
        tree = client.call("POST", f"/v1/sandboxes/{restored['id']}/fork-tree", 201, json={"count": 3})
        assert tree["errors"] == [] and len(tree["children"]) == 3
        hosts = Counter(c["host"] for c in tree["children"])
        others = {"a0", "a1", "a2"} - {home}
        assert set(hosts) == others and hosts[restored["host"]] == CAPACITY - 1, hosts
        for child in tree["children"]:
            assert client.sh(child["id"], "cat /root/marker") == marker

        # the killed agent comes back: its own report decides its rows, and no other host's row changes
        before = rows_of_other_hosts(fleet, home)
        fleet.agent(home).restart()
        fleet.wait_agent_status(home, "up", 60)
        time.sleep(2)  # a few heartbeats of every agent
        assert rows_of_other_hosts(fleet, home) == before
        # its QEMU outlived the agent: adopted, the lost row is running again, with its memory
        assert client.status(parent["id"]) == "running"
        assert client.sh(parent["id"], "cat /root/marker") == marker
        again = client.create()
        assert again["host"] != restored["host"]  # that one is full
        assert client.sh(again["id"], "echo back") == "back\n"

        # a restarted control plane (SIGKILL) loses nothing
        listed = {s["id"]: (s["status"], s["host"]) for s in client.call("GET", "/v1/sandboxes")["items"]}
        assert fleet.control is not None
        fleet.control.kill()
        fleet.control.start()
        for name in ("a0", "a1", "a2"):
            fleet.wait_agent_status(name, "up", 30)
        relisted = {s["id"]: (s["status"], s["host"]) for s in client.call("GET", "/v1/sandboxes")["items"]}
        assert relisted == listed
        assert client.sh(tree["children"][0]["id"], "cat /root/marker") == marker
    finally:
        client.delete_all()


def test_a_bad_node_token_is_refused_and_changes_nothing(fleet: Fleet) -> None:
    with api(fleet) as client:
        refused_everywhere(fleet, client)


def refused_everywhere(fleet: Fleet, client: Api) -> None:
    sandbox = client.create()
    try:
        agents_before = fleet.agents_view()
        forged = {
            "agent": {"name": "intruder", "version": "0", "accelerator": "tcg", "boot_id": "x" * 32, "url": ""},
            "capacity": {"vcpus_total": 64, "memory_total_mib": 1 << 20, "max_sandboxes": 1000},
            "sandboxes": [],
        }
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {fleet.node_token}x"}):
            response = httpx.post(
                f"{fleet.url}/internal/v1/heartbeat", content=json.dumps(forged), headers=headers, trust_env=False
            )
            assert response.status_code == 401, response.text
        assert "intruder" not in fleet.agents_view()
        assert set(fleet.agents_view()) == set(agents_before)

        agent = fleet.agent(sandbox["host"])
        for method, path in (("GET", "/agent/v1/sandboxes"), ("DELETE", f"/agent/v1/sandboxes/{sandbox['id']}")):
            refused = httpx.request(
                method, f"{agent.url}{path}", headers={"Authorization": "Bearer no"}, trust_env=False
            )
            assert refused.status_code == 401, refused.text
        assert client.sh(sandbox["id"], "echo alive") == "alive\n"  # the DELETE without the token did nothing
    finally:
        client.delete_all()


def test_drain_wakes_its_sandboxes_on_other_agents_as_the_same_sandboxes(fleet: Fleet) -> None:
    with api(fleet) as client:
        drained_elsewhere(fleet, client)


def on_agent(fleet: Fleet, name: str, path: str = "") -> Any:
    """The agent's own view (its HTTP interface, node token)."""
    response = httpx.get(
        f"{fleet.agent(name).url}/agent/v1/sandboxes{path}",
        headers={"Authorization": f"Bearer {fleet.node_token}"},
        timeout=30,
        trust_env=False,
    )
    assert response.status_code == 200, response.text
    return response.json()


def drained_elsewhere(fleet: Fleet, client: Api) -> None:
    home, others = "a0", ["a1", "a2"]
    for name in [home, *others]:
        fleet.wait_agent_status(name, "up", 60)
    try:
        for name in others:  # empty: drained at once; the three creates then all land on the home agent
            report = client.call("POST", f"/v1/agents/{name}/drain")
            assert (report["status"], report["count"], report["errors"]) == ("draining", 0, [])
        # the third one hibernates at its timeout and wakes only when resumed: it moves hibernated
        paused = {"ttl_seconds": 5, "on_timeout": "hibernate", "auto_wake": False}
        made = [
            client.create(
                metadata={"n": str(i)},
                env={"E": f"v{i}"},
                network={"egress": "allow", "allow": [f"198.51.100.{i * 8}/29"]},
                **({"ttl_seconds": 3600 + i} if i < 2 else paused),
            )
            for i in range(3)
        ]
        paused_id = made[2]["id"]
        assert {s["host"] for s in made} == {home}
        for name in others:
            assert client.call("POST", f"/v1/agents/{name}/undrain") == {"name": name, "status": "up"}
        before = {s["id"]: on_agent(fleet, home, f"/{s['id']}") for s in made}
        pids = {}
        for i, sandbox in enumerate(made):
            started = "nohup sleep 100000 >/dev/null 2>&1 & echo $!"
            pids[sandbox["id"]] = client.sh(sandbox["id"], f"echo kept-{i} > /root/drain-file; {started}").strip()
        deadline = time.monotonic() + 120
        while client.call("GET", f"/v1/sandboxes/{paused_id}")["status"] != "hibernated":
            assert time.monotonic() < deadline, "not hibernated at its timeout"
            time.sleep(0.5)

        drained = subprocess.run(
            [sys.executable, "-m", "cryobox.cli.main", "agent", "drain", home, "--json"],
            env={**os.environ, **fleet.env()},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert drained.returncode == 0, drained.stderr
        report = json.loads(drained.stdout)
        assert (report["agent"], report["status"], report["count"], report["errors"]) == (home, "draining", 3, [])
        assert sorted(d["id"] for d in report["drained"]) == sorted(pids)
        assert all(d["seconds"] > 0 and not d["already"] for d in report["drained"])
        assert fleet.agents_view()[home]["status"] == "draining"
        assert {s["state"] for s in on_agent(fleet, home)} == {"hibernated"}

        def use(index: int) -> tuple[str, str]:  # the first request wakes it on another agent
            sandbox_id = made[index]["id"]
            return sandbox_id, client.sh(
                sandbox_id, f"cat /root/drain-file; kill -0 {pids[sandbox_id]} && echo alive; echo $E"
            )

        refused = client.http.post(f"/v1/sandboxes/{paused_id}/exec", json={"cmd": "true"})
        assert refused.status_code == 409, refused.text  # moved hibernated, it still waits to be resumed
        client.call("PATCH", f"/v1/sandboxes/{paused_id}/lifecycle", json={"ttl_seconds": 3600})
        client.call("POST", f"/v1/sandboxes/{paused_id}/wake")  # resumed: on another agent
        woke = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            answers = dict(pool.map(use, range(3)))
        print(  # figures for docs/SPECIFICATION.md
            f"\ndrain: {report['seconds']:.1f} s, per sandbox {[d['seconds'] for d in report['drained']]} s; "
            f"3 first requests woken elsewhere in parallel: {time.monotonic() - woke:.1f} s"
        )
        for i, sandbox in enumerate(made):
            sandbox_id = sandbox["id"]
            assert answers[sandbox_id] == f"kept-{i}\nalive\nv{i}\n"  # files, the same process, its env
            row = client.call("GET", f"/v1/sandboxes/{sandbox_id}")
            assert row["host"] in others and row["status"] == "running"
            assert row["instance_id"] == sandbox["instance_id"] and row["metadata"] == {"n": str(i)}
            moved = on_agent(fleet, row["host"], f"/{sandbox_id}")
            same: tuple[str, ...] = ("instance_id", "workspace_id", "metadata", "env", "egress", "created_at")
            same += ("ttl_s",) if sandbox_id != paused_id else ()  # its TTL changed before its wake
            assert {k: moved[k] for k in same} == {k: before[sandbox_id][k] for k in same}
            assert (row["on_timeout"], row["auto_wake"]) == (("hibernate", False) if i == 2 else ("kill", True))
            assert client.sh(sandbox_id, "cat /run/cryobox/instance-id").strip() == sandbox["instance_id"]
        assert on_agent(fleet, home) == []  # the drained agent runs (and holds) nothing
        assert open_store(fleet.store_url, env=S3_CREDENTIALS).list("hibernations") == []
    finally:
        client.delete_all()
        for name in [home, *others]:
            client.http.post(f"/v1/agents/{name}/undrain")


def test_streams_across_an_agent_restart_and_a_control_plane_killed_mid_burst(fleet: Fleet) -> None:
    """8 sandboxes stream output while the agent holding three of them is SIGKILLed and restarted: the other
    streams finish whole, the cut ones end (never hang), and every writer kept running through the restart.
    Then the control plane is SIGKILLed in the middle of a burst of creates: after it restarts, every sandbox
    an agent runs has a row (the ones it made for the dead control plane are deleted once their reservations
    expire) and every row answers."""
    with api(fleet) as client:
        for name in fleet.names:
            fleet.wait_agent_status(name, "up", 60)
        try:
            streaming_restart(fleet, client)
            client.delete_all()
            control_killed_mid_burst(fleet, client)
        finally:
            client.delete_all()


LINES = 40


def streaming_restart(fleet: Fleet, client: Api) -> None:
    made = [client.create() for _ in range(8)]
    hosts = Counter(s["host"] for s in made)
    victim = hosts.most_common(1)[0][0]
    writer = f"for i in $(seq 1 {LINES}); do echo $i | tee -a /root/out; sleep 0.25; done"

    def stream(sandbox_id: str) -> tuple[str, int, bool]:
        lines, finished, event = 0, False, ""
        try:
            with client.http.stream(
                "POST", f"/v1/sandboxes/{sandbox_id}/exec/stream", json={"cmd": writer, "timeout_seconds": 120}
            ) as response:
                for raw in response.iter_lines():
                    if raw.startswith("event:"):
                        event = raw.removeprefix("event:").strip()
                        finished = finished or event == "exit"
                    elif raw.startswith("data:") and event == "stdout":
                        lines += json.loads(raw.removeprefix("data:"))["chunk"].count("\n")
        except httpx.HTTPError:
            pass
        return sandbox_id, lines, finished

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream, s["id"]) for s in made]
        time.sleep(3)  # every writer is under way
        began = time.monotonic()
        fleet.kill_agent(victim)
        restarted = fleet.agent(victim)
        with notify_socket(fleet.root / f"{victim}.notify") as notes:  # systemd's, as cryobox-agent.service has it
            restarted.extra_env["NOTIFY_SOCKET"] = str(notes.path)
            try:
                restarted.start()
                notes.wait_for("READY=1")  # once it serves (sent from inside its network namespace's wrapper)
            finally:
                del restarted.extra_env["NOTIFY_SOCKET"]
        fleet.wait_agent_status(victim, "up", 60)
        results = {f.result(timeout=120)[0]: f.result()[1:] for f in futures}
    print(f"\nagent restart under 8 streams: up again in {time.monotonic() - began:.1f} s")
    for sandbox in made:
        lines, finished = results[sandbox["id"]]
        if sandbox["host"] != victim:
            assert finished and lines >= LINES, (sandbox["host"], lines)
        assert client.status(sandbox["id"]) == "running"
    for sandbox in made:  # the writers on the restarted agent ran on without it
        wait_for(
            f"the writer of {sandbox['id']} finishing",
            lambda sid=sandbox["id"]: client.sh(sid, "wc -l < /root/out").strip() == str(LINES),
            60,
        )


def control_killed_mid_burst(fleet: Fleet, client: Api) -> None:
    assert fleet.control is not None
    with ThreadPoolExecutor(6) as pool:
        burst = [pool.submit(client.http.post, "/v1/sandboxes", json={"template": "base"}) for _ in range(6)]
        time.sleep(1.0)
        fleet.control.kill()
        for future in burst:
            try:
                future.result(timeout=120)
            except httpx.HTTPError:
                pass
    fleet.control.start()
    for name in fleet.names:
        fleet.wait_agent_status(name, "up", 30)

    def agents_agree() -> bool:
        rows = {s["id"] for s in client.call("GET", "/v1/sandboxes")["items"]}
        running = {s["id"] for name in fleet.names for s in on_agent(fleet, name)}
        return running == rows

    took = wait_for("every sandbox the agents run to have a row", agents_agree, RESERVATION_TTL_S + 30)
    print(f"control plane killed mid-burst: agents and rows agree {took:.1f} s after its restart")
    for sandbox in client.call("GET", "/v1/sandboxes")["items"]:
        assert sandbox["status"] == "running"
        assert client.sh(sandbox["id"], "echo ok") == "ok\n"
    assert client.create()["status"] == "running"  # and creating works


def test_e2b_sdk_and_guest_ports_through_the_fleet(fleet: Fleet, e2b_python: Path, tmp_path: Path) -> None:
    """The sandbox side of the E2B SDK and a guest port, through a control plane whose agents are other
    processes on other addresses: every call goes control plane → the sandbox's agent (node token) → guest."""
    report = run_app(e2b_python, fleet.url, fleet.api_key, tmp_path, "fleet")
    assert report["run"] == "fleet\nuser\n"
    assert report["background"] == {"listed": True, "killed": True}
    assert report["write_read"] == ["/home/user/f.txt", "fleet file"]
    assert "touched" in report["watch"] and report["kill"] is True
    with api(fleet) as client:
        sandbox = client.create()
        try:
            client.sh(sandbox["id"], "mkdir -p /srv && echo hop > /srv/hop.txt")
            client.sh(
                sandbox["id"],
                "setsid nohup python3 -m http.server 8080 --directory /srv >/dev/null 2>&1 </dev/null &",
            )
            url = f"/v1/sandboxes/{sandbox['id']}/ports/8080/hop.txt"
            wait_for("the guest's http.server", lambda: client.http.get(url).status_code == 200, 60)
            got = client.http.get(url)
            assert got.status_code == 200 and got.text == "hop\n"
            closed = client.http.get(f"/v1/sandboxes/{sandbox['id']}/ports/9/")
            assert closed.status_code == 502 and "port is not open" in closed.json()["error"]
        finally:
            client.delete_all()


def test_a_volume_written_on_one_agent_is_read_on_another_after_its_agent_drains(fleet: Fleet) -> None:
    """Issue 34's fleet case: a volume written by a sandbox on agent A moves through the object store when A
    drains, and a sandbox placed on agent B reads the same bytes."""
    for name in ("a0", "a1", "a2"):
        fleet.wait_agent_status(name, "up", 60)
    with api(fleet) as client:
        volume = client.call("POST", "/v1/volumes", 201, json={"name": "fleetvol", "size_mb": 64})
        source = volume["host"]
        try:
            writer = client.create(volumes=[{"name": "fleetvol", "path": "/data"}])
            assert writer["host"] == source
            digest = client.sh(
                writer["id"], "head -c 8388608 /dev/urandom > /data/blob && sync && sha256sum /data/blob | cut -c1-64"
            ).strip()
            client.call("DELETE", f"/v1/sandboxes/{writer['id']}", 204)
            report = client.call("POST", f"/v1/agents/{source}/drain")
            assert report["status"] == "draining"
            started = time.monotonic()
            reader = client.create(volumes=[{"name": "fleetvol", "path": "/data", "read_only": True}])
            moved_s = time.monotonic() - started
            assert reader["host"] != source
            assert client.sh(reader["id"], "sha256sum /data/blob | cut -c1-64").strip() == digest
            view = client.call("GET", "/v1/volumes/fleetvol")
            assert (view["host"], view["status"]) == (reader["host"], "ready") and view["stored_at"] is not None
            store = open_store(fleet.store_url, env=S3_CREDENTIALS)
            assert store.exists(f"volumes/{volume['id']}/manifest.json")
            print(f"\nvolume move on create (64 MiB, 8 MiB written): {moved_s:.2f} s to the created sandbox")
            client.call("DELETE", f"/v1/sandboxes/{reader['id']}", 204)
        finally:
            client.http.post(f"/v1/agents/{source}/undrain")
            client.delete_all()
            client.http.delete("/v1/volumes/fleetvol")


def test_a_drained_sandbox_wakes_elsewhere_with_its_volumes_mounted_in_their_slots(fleet: Fleet) -> None:
    """A sandbox writing two volumes is drained with its agent: the drain stores its hibernation and then the
    volumes; its next request wakes it on another agent, where its volumes arrived first, each in the slot its
    guest has it mounted from: the files are there, new writes land in the moved volume, and the old agent keeps
    no copy."""
    for name in ("a0", "a1", "a2"):
        fleet.wait_agent_status(name, "up", 60)
    with api(fleet) as client:
        vols = [client.call("POST", "/v1/volumes", 201, json={"name": f"dv{i}", "size_mb": 32}) for i in (1, 2)]
        source = vols[0]["host"]
        try:
            mounts = [{"name": "dv1", "path": "/data1"}, {"name": "dv2", "path": "/data2"}]
            sandbox = client.create(volumes=mounts)
            home = sandbox["host"]
            pid = client.sh(
                sandbox["id"],
                "echo one > /data1/f && echo two > /data2/f && sync && nohup sleep 100000 >/dev/null 2>&1 & echo $!",
            ).strip()
            report = client.call("POST", f"/v1/agents/{home}/drain")
            assert (report["count"], report["errors"]) == (1, []), report
            for vol in vols:
                view = client.call("GET", f"/v1/volumes/{vol['name']}")
                assert view["host"] == home and view["stored_at"] is not None  # stored by the drain

            answer = client.sh(
                sandbox["id"],
                f"cat /data1/f /data2/f; kill -0 {pid} && echo alive; echo three > /data2/g && sync && cat /data2/g",
            )

            assert answer == "one\ntwo\nalive\nthree\n"
            row = client.call("GET", f"/v1/sandboxes/{sandbox['id']}")
            assert row["host"] != home and row["status"] == "running"
            for vol in vols:
                view = client.call("GET", f"/v1/volumes/{vol['name']}")
                assert view["host"] == row["host"] and [a["sandbox_id"] for a in view["attached_to"]] == [row["id"]]
            held = httpx.get(
                f"{fleet.agent(home).url}/agent/v1/volumes",
                headers={"Authorization": f"Bearer {fleet.node_token}"},
                timeout=30,
                trust_env=False,
            ).json()
            assert not {v["volume_id"] for v in held} & {v["id"] for v in vols}, held  # the old copies went
            client.call("DELETE", f"/v1/sandboxes/{sandbox['id']}", 204)
            reader = client.create(volumes=[{"name": "dv2", "path": "/data", "read_only": True}])
            assert client.sh(reader["id"], "cat /data/f /data/g") == "two\nthree\n"  # the write after the wake
            assert source == home
        finally:
            client.delete_all()
            for name in ("a0", "a1", "a2"):
                client.http.post(f"/v1/agents/{name}/undrain")
            for i in (1, 2):
                client.http.delete(f"/v1/volumes/dv{i}")
