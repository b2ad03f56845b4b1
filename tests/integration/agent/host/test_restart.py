"""Restarting ``cryobox serve`` loses no sandbox: after a SIGKILL (what the OOM killer does) and after a SIGTERM
(an upgrade), running, paused and hibernated sandboxes (one hibernated by its timeout, ``on_timeout:
hibernate``, waking only when resumed) come back with their processes and memory; a SIGTERM exits within seconds;
``--on-stop kill`` leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.guestnet import reached
from tests.support.internet import Internet
from tests.support.netutil import OUTSIDE_RANGE
from tests.support.pids import alive
from tests.support.serve import Client
from tests.support.teardown import reclaim_data_dir

# One template and two network slots are all this test needs (each extra template and slot is start-up time).
SMALL = ["--templates", "base", "--net-pool", "2"]
KEEP = {"CRYOBOX_ON_STOP": "keep"}


def _states(client: Client) -> dict[str, str]:
    return {s["id"]: s["status"] for s in client.call("GET", "/v1/sandboxes")["items"]}


def test_sandboxes_survive_sigkill_and_sigterm(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template], suite_internet: Internet
) -> None:
    data_dir = tmp_path / "data"
    names = {"CRYOBOX_DNS_UPSTREAM": suite_internet.dns, "CRYOBOX_EGRESS_ALLOW_PRIVATE": OUTSIDE_RANGE}
    run_dir = data_dir / "vol" / "run"
    started: list[ServeProcess] = []

    def serve(env: dict[str, str]) -> ServeProcess:
        proc = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=1, extra_args=SMALL, extra_env={**names, **env})
        started.append(proc)
        return proc.start()

    try:
        first = serve(KEEP)
        client = Client(first.url, first.api_key)
        policy = {"allow": ["example.org"]}
        client.call("POST", "/v1/volumes", 201, json={"name": "kept", "size_mb": 32})
        running = client.create(network=policy)["id"]
        paused = client.create(network=policy, volumes=[{"name": "kept", "path": "/data"}])["id"]
        timeout: dict[str, Any] = {"ttl_seconds": 3, "on_timeout": "hibernate", "auto_wake": False}  # as agents ask
        hibernated = client.create(network=policy, **timeout)["id"]
        assert reached(client, running) == {"example.org"}
        for sandbox_id in (running, hibernated, paused):  # a process and a file in guest RAM (tmpfs /run)
            client.sh(sandbox_id, f"echo {sandbox_id} > /run/mark; (sleep 100000 &) ; pgrep -n sleep > /root/pid")
        deadline = time.monotonic() + 120
        while _states(client)[hibernated] != "hibernated":  # its TTL's expiry hibernates it (reaper: every 5 s)
            assert time.monotonic() < deadline, "not hibernated at its timeout"
            time.sleep(0.5)
        client.sh(paused, "echo synced > /data/f && sync /data/f")  # on the volume, fsynced
        client.call("POST", f"/v1/sandboxes/{paused}/pause", 204)
        snap = client.snapshot(running, retain=True)
        before = set(find_own_qemus(run_dir))
        record = data_dir / "vol" / "sandboxes" / f"{running}.json"
        written = record.stat().st_mtime_ns
        client.http.close()
        first.stop(signal.SIGKILL)
        assert before and all(alive(pid) for pid in before), "QEMUs outlive a SIGKILLed server"

        second = serve(KEEP)
        client = Client(second.url, second.api_key)
        assert _states(client) == {running: "running", hibernated: "hibernated", paused: "paused"}
        check = "cat /run/mark; kill -0 $(cat /root/pid) && echo alive"
        assert client.sh(running, check) == f"{running}\nalive\n"  # same process, same memory
        assert reached(client, running) == {"example.org"}  # its policy served again by the new agent
        assert record.stat().st_mtime_ns == written  # adopted as it was: its record is not written again
        client.call("POST", f"/v1/sandboxes/{paused}/resume", 204)
        assert client.sh(paused, check) == f"{paused}\nalive\n"
        # its volume stayed attached through the SIGKILL of the agent: the same mount, the fsynced file, writable
        assert client.sh(paused, "cat /data/f; echo more >> /data/f; grep -c ' /data ' /proc/mounts") == "synced\n1\n"
        assert [a["sandbox_id"] for a in client.call("GET", "/v1/volumes/kept")["attached_to"]] == [paused]
        refused = client.http.post(f"/v1/sandboxes/{hibernated}/exec", json={"cmd": "true"})
        assert refused.status_code == 409 and _states(client)[hibernated] == "hibernated", refused.text  # no auto-wake
        client.call("PATCH", f"/v1/sandboxes/{hibernated}/lifecycle", json={"ttl_seconds": 3600})
        client.call("POST", f"/v1/sandboxes/{hibernated}/wake")
        assert client.sh(hibernated, check) == f"{hibernated}\nalive\n"
        client.snapshot(hibernated)  # a woken sandbox snapshots (it used to answer 500: no mapping of its memory)
        restored = client.create(from_snapshot=snap["id"])["id"]
        assert client.sh(restored, "cat /run/mark") == f"{running}\n"
        client.http.close()

        began = time.monotonic()
        assert second.stop(signal.SIGTERM, timeout_s=30) == 0
        took = time.monotonic() - began
        assert took < 10, f"SIGTERM took {took:.1f}s"
        left = set(find_own_qemus(run_dir))
        assert len(left) >= 4 and all(alive(pid) for pid in left), "--on-stop keep leaves the VMs running"

        third = serve({"CRYOBOX_ON_STOP": "kill"})
        client = Client(third.url, third.api_key)
        states = _states(client)
        assert {states[i] for i in (running, hibernated, paused, restored)} == {"running"}
        assert client.sh(restored, "kill -0 $(cat /root/pid) && echo alive") == "alive\n"
        client.http.close()
        assert third.stop(signal.SIGTERM) == 0
        assert find_own_qemus(run_dir) == [], "--on-stop kill leaves no QEMU"
        assert not any(alive(pid) for pid in left)
    finally:
        for proc in started:
            proc.stop(signal.SIGKILL)
        reclaim_data_dir(data_dir, cache_dir)


async def test_a_failed_start_leaves_nothing(tmp_path: Path, cache_dir: Path) -> None:
    """A start that fails late (here: fetching templates from an empty store, after the volume, the firewall
    table, the network slots, the hot dir and the memory server were set up) undoes every step before it."""
    from cryobox.agent.host.ownership import held_by_other
    from cryobox.agent.host.startup import HostConfig, start_host
    from cryobox.agent.memory.settings import StorageConfig, TemplateSource
    from cryobox.agent.net.netlink import list_tagged
    from cryobox.agent.net.slots import tag_for
    from cryobox.config import Paths
    from cryobox.errors import ObjectNotFound

    paths = Paths(tmp_path / "data", cache_dir)
    (tmp_path / "empty").mkdir()
    storage = StorageConfig(store_url=f"file://{tmp_path / 'empty'}", template_source=TemplateSource.STORE)
    config = HostConfig(paths=paths, net_pool=2, storage=storage)
    try:
        with pytest.raises(ObjectNotFound):
            await start_host(config, print)
        tag = tag_for(paths.data_dir)
        tagged = await asyncio.to_thread(list_tagged, tag)
        assert tagged.netns == [] and tagged.links == []
        assert not os.path.ismount(paths.memserver_dir / "mnt")
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
        assert f"cryobox_{tag}" not in tables
        assert not os.path.ismount(paths.volume_dir)
        assert not held_by_other(paths.data_dir)
        assert not paths.hot_dir.exists() or not any(paths.hot_dir.iterdir())
    finally:
        await asyncio.to_thread(reclaim_data_dir, paths.data_dir, cache_dir)


def test_lazily_paged_vms_survive_a_restart(tmp_path: Path, cache_dir: Path, templates: dict[str, Template]) -> None:
    """A VM whose RAM is paged in through the memory server keeps faulting while the agent is dead and after
    it restarted: the memory server outlives the agent and the new agent reattaches to it."""
    data_dir = tmp_path / "data"
    pidfile = data_dir / "memserver" / "memserver.pid"
    lazy = [*SMALL, "--memory", "lazy"]
    first = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=lazy, extra_env=KEEP).start()
    second: ServeProcess | None = None
    try:
        client = Client(first.url, first.api_key)
        sandbox = client.create()["id"]
        client.sh(sandbox, "(sleep 100000 &) ; pgrep -n sleep > /root/pid")
        memserver = int(pidfile.read_text())
        client.http.close()
        first.stop(signal.SIGKILL)
        (qemu,) = find_own_qemus(data_dir / "vol" / "run")
        time.sleep(1.0)  # the guest runs on with nobody but the memory server behind it
        assert alive(memserver) and alive(qemu)

        second = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=lazy).start()
        client = Client(second.url, second.api_key)
        assert int(pidfile.read_text()) == memserver, "the restarted agent reattached to the memory server"
        # touch pages of the image the guest never read yet: every one is a FUSE read
        touch = "cat /usr/lib/x86_64-linux-gnu/*.so* > /dev/null; kill -0 $(cat /root/pid) && echo alive"
        assert client.sh(sandbox, touch) == "alive\n"
        assert alive(qemu)
        client.http.close()
        assert second.stop(signal.SIGTERM) == 0
        assert not alive(memserver) and not alive(qemu), "--on-stop kill stops the VM and the memory server"
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            second.stop(signal.SIGKILL)
        reclaim_data_dir(data_dir, cache_dir)
