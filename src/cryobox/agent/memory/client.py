"""The host agent's side of the memory server: start it, find its files, ask it for figures, stop it.

The agent names an image by its file name (:func:`image_name`): the store prefix and the sha256 that the local
manifest of the template or snapshot pins for the image's ``memory.idx``, which the server checks before it
parses the index. Control calls take the same name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ...errors import ERRORS_BY_CODE, ChunkFetchFailed, CryoboxError, IntegrityError, VmmError
from ...objstore.pins import pinned_sha256
from ...util.system import scrubbed_env
from ...util.tls import default_tls_context
from .mounts import unmount
from .server.fusefs import INDEX_NAME, file_name, parse_name

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


def image_name(manifest: Mapping[str, Any], prefix: str) -> str:
    """The memory server's file name for the image stored under ``prefix``, pinned to the sha256 ``manifest``
    (the local manifest of what is restored) records for ``<prefix>/memory.idx``.

    :raises IntegrityError: ``manifest`` pins no hash for that index: its RAM cannot be paged from the store.
    """
    key = f"{prefix}/{INDEX_NAME}"
    sha256 = pinned_sha256(manifest, key)
    if sha256 is None:
        raise IntegrityError(
            f"the manifest pins no hash for the chunk index {key!r}: its memory cannot be paged from the store",
            details={"key": key},
        )
    return file_name(prefix, sha256)


MEMSERVER_MODULE = "cryobox.agent.memory.server.main"
"""What ``python -m`` runs as the memory server; a process's command line names it."""
LEGACY_MEMSERVER_MODULES = ("cryobox.agent.store.memserver",)
"""Its name before the package re-layout: a memory server an older agent left running is still recognised (an
upgraded agent adopts it, ``cryobox gc`` reclaims it)."""


def is_memory_server(argv: list[str] | tuple[str, ...]) -> bool:
    """Whether a command line is a memory server's (this version's module name or an earlier one)."""
    return MEMSERVER_MODULE in argv or any(name in argv for name in LEGACY_MEMSERVER_MODULES)


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
    image_gid: int | None = None
    """Jailed QEMUs (other uids) map the files: the mount admits other users, and the kernel checks the
    files' modes (``root:image_gid``, 0660); ``None`` (no jail): only root, the mounting user, may open them."""

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
        argv = [sys.executable, "-m", MEMSERVER_MODULE]
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
        if self.image_gid is not None:
            argv += ["--image-gid", str(self.image_gid)]
        return [*argv, "--pinned-names", "--content-chunks"]


def running_server(config: MemServerConfig) -> tuple[int, list[str]] | None:
    """The pid and argv of the memory server an earlier agent started for this mount, if it still runs."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, PermissionError, OSError):
        pid = int(config.pidfile.read_text())
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        if is_memory_server(argv) and str(config.mount) in argv:
            return pid, argv
    return None


def _kill(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)


def reclaim(config: MemServerConfig) -> None:
    """Stop a memory server an earlier agent left behind and detach its mount. Idempotent."""
    found = running_server(config)
    if found is not None:
        _kill(found[0], STOP_TIMEOUT_S)
    config.pidfile.unlink(missing_ok=True)
    unmount(config.mount)


class MemoryServerProcess:
    """One running memory server. :meth:`stop` is idempotent."""

    def __init__(self, config: MemServerConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(config.control), verify=default_tls_context()),
            base_url="http://memserver",
            timeout=10.0,
        )

    @property
    def pid(self) -> int | None:
        return self._pid

    def path_for(self, name: str) -> Path:
        """The file QEMU maps for the memory image ``name`` (:func:`image_name`: it must carry its index pin)."""
        if parse_name(name)[1] is None:
            raise ValueError(f"memory image name {name!r} carries no index pin")
        return self.config.mount / name

    def start(self) -> bool:
        """Reattach to the server an earlier agent started (same settings, mount up), or start one and wait until
        its mount and control socket answer (blocking; run in a thread). Returns whether it reattached.

        The server runs in its own session with no death signal: lazily paged VMs keep faulting through it while
        the agent restarts."""
        found = running_server(self.config)
        if found is not None and found[1][1:] == self.config.argv()[1:] and os.path.ismount(self.config.mount):
            self._pid = found[0]
            return True
        reclaim(self.config)
        self.config.root.mkdir(parents=True, exist_ok=True)
        with open(self.config.log, "ab") as log:
            self._proc = subprocess.Popen(  # store credentials yes, the control plane's secrets no
                self.config.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=scrubbed_env()
            )
        self._pid = self._proc.pid
        self.config.pidfile.write_text(str(self._proc.pid))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise VmmError(f"memory server exited ({self._proc.returncode}): {self._tail()}")
            if os.path.ismount(self.config.mount) and self.config.control.exists():
                return False
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
        pid, self._pid = self._pid, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elif proc is None and pid is not None and running_server(self.config) is not None:
            _kill(pid, STOP_TIMEOUT_S)
        unmount(self.config.mount)
        self.config.pidfile.unlink(missing_ok=True)

    async def aclose(self, keep: bool = False) -> None:
        """Stop the server, or with ``keep`` leave it running for the next agent (VMs map its files)."""
        if not keep:
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

    async def first_reads(self, name: str) -> list[int]:
        response = await self._get(f"/images/{name}/first-reads")
        response.raise_for_status()
        return [int(i) for i in response.json()]

    async def forget_reads(self, name: str) -> None:
        (await self._client.post(f"/images/{name}/forget-reads")).raise_for_status()

    async def prefetch(self, name: str) -> int:
        """Start replaying the image's stored trace; returns its length (0 when the image has no trace)."""
        response = await self._client.post(f"/images/{name}/prefetch")
        if response.status_code == 404:
            return 0
        response.raise_for_status()
        return int(response.json()["chunks"])

    async def failure(self, name: str, since: float | None = None) -> CryoboxError | None:
        """The last chunk (or index) fetch that failed for the image, if any (to explain a restore that died);
        with ``since`` (seconds of ``CLOCK_BOOTTIME``, e.g. when the VM started) only one recorded at or after it."""
        params = {} if since is None else {"since": repr(since)}
        response = await self._client.get(f"/images/{name}/failure", params=params)
        if response.status_code == 404:
            return None
        wire = response.json()
        cls = ERRORS_BY_CODE.get(str(wire.get("code")), ChunkFetchFailed)
        return cls(f"restore failed: {wire.get('error')}", details=dict(wire.get("details") or {}))
