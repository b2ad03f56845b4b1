"""Restarting ``cryobox serve`` (even after SIGKILL) leaves no QEMU process behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cryobox import Sandbox
from cryobox.agent.reclaim import find_own_qemus
from cryobox.agent.templates import Template
from cryobox.bench.server import ServeProcess


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_restart_after_sigkill_reclaims_qemu(tmp_path: Path, cache_dir: Path, templates: dict[str, Template]) -> None:
    data_dir = tmp_path / "data"
    run_dir = data_dir / "vol" / "run"
    first = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=1).start()
    second: ServeProcess | None = None
    try:
        sbx = Sandbox.create(template="base", api_url=first.url, api_key=first.api_key)
        assert sbx.exec("echo up").stdout == "up\n"
        sbx.close()
        orphans = find_own_qemus(run_dir)
        assert len(orphans) >= 2  # the sandbox plus pooled QEMUs
        first.stop(signal.SIGKILL)
        assert all(_alive(pid) for pid in orphans), "QEMU outlives a SIGKILLed server (reclaim must handle it)"

        second = ServeProcess(data_dir, cache_dir=cache_dir, prespawn=1).start()
        assert not any(_alive(pid) for pid in orphans)
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
