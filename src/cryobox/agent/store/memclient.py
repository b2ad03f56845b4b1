"""The host agent's side of the memory server: start it, find its files, ask it for figures, stop it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ...errors import ERRORS_BY_CODE, ChunkFetchFailed, CryoboxError, VmmError
from .fusefs import file_name
from .mounts import unmount

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MemServerConfig:
    root: Path
    """Holds ``mnt/`` (the FUSE mount), ``control.sock``, ``memserver.pid`` and ``memserver.log``."""
    store_url: str
    cache_dir: Path
    cache_budget_bytes: int
    faults: str = ""
    naive: bool = False
    fetch_deadline_s: float | None = None
    retries: int | None = None

    @property
    def mount(self) -> Path:
        return self.root / "mnt"

    @property
    def control(self) -> Path:
        return self.root / "control.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "memserver.pid"

    @property
    def log(self) -> Path:
        return self.root / "memserver.log"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cryobox.agent.store.memserver"]
        argv += ["--mount", str(self.mount), "--control", str(self.control), "--store", self.store_url]
        argv += ["--cache-dir", str(self.cache_dir), "--cache-budget", str(self.cache_budget_bytes)]
        if self.faults:
            argv += ["--faults", self.faults]
        if self.naive:
            argv.append("--naive")
        if self.fetch_deadline_s is not None:
            argv += ["--fetch-deadline", str(self.fetch_deadline_s)]
        if self.retries is not None:
            argv += ["--retries", str(self.retries)]
        return argv


def reclaim(config: MemServerConfig) -> None:
    """Stop a memory server a dead agent left behind and detach its mount. Idempotent."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        pid = int(config.pidfile.read_text())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"cryobox.agent.store.memserver" in cmdline and str(config.mount).encode() in cmdline:
                os.kill(pid, signal.SIGKILL)
        config.pidfile.unlink()
    unmount(config.mount)


class MemoryServerProcess:
    """One running memory server. :meth:`stop` is idempotent."""

    def __init__(self, config: MemServerConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(config.control)), base_url="http://memserver", timeout=10.0
        )

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def path_for(self, prefix: str) -> Path:
        """The file QEMU maps for the memory image stored under ``prefix``."""
        return self.config.mount / file_name(prefix)

    def start(self) -> None:
        """Start the server and wait until its mount and control socket answer (blocking; run in a thread)."""
        reclaim(self.config)
        self.config.root.mkdir(parents=True, exist_ok=True)
        with open(self.config.log, "ab") as log:
            self._proc = subprocess.Popen(self.config.argv(), stdout=log, stderr=subprocess.STDOUT)
        self.config.pidfile.write_text(str(self._proc.pid))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise VmmError(f"memory server exited ({self._proc.returncode}): {self._tail()}")
            if os.path.ismount(self.config.mount) and self.config.control.exists():
                return
            time.sleep(0.02)
        self.stop()
        raise VmmError(f"memory server did not come up in {START_TIMEOUT_S:.0f}s: {self._tail()}")

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.config.log.read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        """SIGTERM (libfuse unmounts on the way out), then SIGKILL and a lazy unmount. Idempotent, blocking."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        unmount(self.config.mount)
        self.config.pidfile.unlink(missing_ok=True)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.stop)
        await self._client.aclose()

    async def _get(self, path: str) -> httpx.Response:
        return await self._client.get(path)

    async def stats(self) -> dict[str, Any]:
        response = await self._get("/stats")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def metrics_text(self) -> str:
        response = await self._get("/metrics")
        response.raise_for_status()
        return response.text

    async def first_reads(self, prefix: str) -> list[int]:
        response = await self._get(f"/images/{file_name(prefix)}/first-reads")
        response.raise_for_status()
        return [int(i) for i in response.json()]

    async def forget_reads(self, prefix: str) -> None:
        (await self._client.post(f"/images/{file_name(prefix)}/forget-reads")).raise_for_status()

    async def prefetch(self, prefix: str) -> int:
        """Start replaying the image's stored trace; returns its length (0 when the image has no trace)."""
        response = await self._client.post(f"/images/{file_name(prefix)}/prefetch")
        if response.status_code == 404:
            return 0
        response.raise_for_status()
        return int(response.json()["chunks"])

    async def failure(self, prefix: str) -> CryoboxError | None:
        """The last chunk (or index) fetch that failed for the image, if any (to explain a restore that died)."""
        response = await self._get(f"/images/{file_name(prefix)}/failure")
        if response.status_code == 404:
            return None
        wire = response.json()
        cls = ERRORS_BY_CODE.get(str(wire.get("code")), ChunkFetchFailed)
        return cls(f"restore failed: {wire.get('error')}", details=dict(wire.get("details") or {}))
