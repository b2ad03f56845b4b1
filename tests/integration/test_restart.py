"""Restarting ``cryobox serve`` (even after SIGKILL) leaves no QEMU process behind, and keeps its snapshots."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cryobox import Sandbox
from cryobox.agent.reclaim import find_own_qemus
from cryobox.agent.templates import Template
from cryobox.bench.server import ServeProcess

from .support import Client


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# One template and two network slots are all this test needs (each extra template and slot is start-up time).
SMALL = ["--templates", "base", "--net-pool", "2"]


def test_restart_after_sigkill_reclaims_qemu(tmp_path: Path, cache_dir: Path, templates: dict[str, Template]) -> None:
    """One crash for both consequences: the orphaned QEMUs are reclaimed, and a retained snapshot survives (it was
    test_snapshots.py's test_snapshots_survive_a_server_crash, with two server starts of its own)."""
    data_dir = tmp_path / "data"
    run_dir = data_dir / "vol" / "run"
    first = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=1, extra_args=SMALL).start()
    second: ServeProcess | None = None
    try:
        client = Client(first.url, first.api_key)
        sandbox = client.create()
        assert client.sh(sandbox["id"], "echo up; echo durable > /root/d") == "up\n"
        snap = client.snapshot(sandbox["id"], retain=True)
        client.http.close()  # disconnect only: the sandbox keeps running
        orphans = find_own_qemus(run_dir)
        assert len(orphans) >= 2  # the sandbox plus the pool's refill (take() starts it before handing out)
        first.stop(signal.SIGKILL)
        assert all(_alive(pid) for pid in orphans), "QEMU outlives a SIGKILLed server (reclaim must handle it)"

        second = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=1, extra_args=SMALL).start()
        assert not any(_alive(pid) for pid in orphans)
        client = Client(second.url, second.api_key)
        try:  # the snapshot taken before the crash is still there, retained, and restores
            assert client.call("GET", f"/v1/snapshots/{snap['id']}")["retain"] is True
            restored = client.create(from_snapshot=snap["id"])
            assert client.sh(restored["id"], "cat /root/d") == "durable\n"
        finally:
            client.close()
        with Sandbox.create(template="base", api_url=second.url, api_key=second.api_key) as again:
            assert again.exec("echo again").stdout == "again\n"
        assert second.stop() == 0
        assert find_own_qemus(run_dir) == []
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            second.stop(signal.SIGKILL)
        for pid in find_own_qemus(run_dir):
            os.kill(pid, signal.SIGKILL)
        first.cleanup()
