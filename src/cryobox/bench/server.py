"""A real ``cryobox serve`` process for benchmarks and end-to-end tests, stopped by PID."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from ..agent.disk.volume import release_volume
from ..agent.host.gcscan import remove_cgroups
from ..agent.host.ownership import owners_dir_from_env, remove_owner
from ..agent.memory.mounts import unmount
from ..agent.net.slots import tag_for
from ..compose.handover import LAUNCHER
from ..config import DEFAULT_CACHE_DIR, Paths
from .childproc import ChildProcess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


HAND_OVER = LAUNCHER
"""What systemd does between its fork and the exec (:data:`cryobox.compose.handover.LAUNCHER`)."""


def release_serve_state(data_dir: Path, cache_dir: Path | None) -> None:
    """What a ``cryobox serve`` (or agent) with ``data_dir`` may leave when it dies without cleaning up: the
    memory server's mount, the data volume, the hot directory, its VMs' (empty) cgroups, and its owner record
    (``cryobox gc`` would remove it once the data dir is gone; every start reads them all: 312 left by runs here
    cost a restart 0.1-0.3 s)."""
    paths = Paths(data_dir, cache_dir or DEFAULT_CACHE_DIR)
    unmount(paths.memserver_dir / "mnt")  # a memory server killed with serve leaves its mount disconnected
    release_volume(data_dir)
    shutil.rmtree(paths.hot_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # a cgroup whose QEMU is still being reaped stays
        remove_cgroups(Path("/sys/fs/cgroup"), tag_for(data_dir))
    remove_owner(tag_for(data_dir), owners_dir_from_env())


class ServeProcess(ChildProcess):
    """Starts ``cryobox serve`` on a free loopback port with its own data dir; ``stop()`` is idempotent."""

    what = "cryobox serve"
    start_timeout_s = 1800.0
    poll_interval_s = 0.1
    cleanup_on_timeout = True

    def __init__(
        self,
        data_dir: Path,
        *,
        cache_dir: Path | None = None,
        prespawn: int = 2,
        pool_mode: str = "warm",
        log_path: Path | None = None,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        listen_socket: socket.socket | None = None,
    ) -> None:
        super().__init__(data_dir, log_path or data_dir / "serve.log", extra_env, extra_args)
        self.cache_dir = cache_dir
        self.prespawn = prespawn
        self.pool_mode = pool_mode
        self.listen_socket = listen_socket
        """Given, this harness is the supervisor: every process it starts is handed this listening socket as
        systemd's socket activation does (fd 3, ``LISTEN_FDS``), so connections wait across restarts."""
        self.port = int(listen_socket.getsockname()[1]) if listen_socket is not None else free_port()
        self.api_key = "cbx_test_" + secrets.token_hex(8)
        self.url = f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cryobox.cli.main", "serve", "--data-dir", str(self.data_dir)]
        argv += ["--port", str(self.port), "--prespawn", str(self.prespawn), "--pool-mode", self.pool_mode]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        return argv + self.extra_args

    def launch(self) -> None:
        if self.listen_socket is None:
            super().launch()
            return
        fd = self.listen_socket.fileno()
        env = {**self.child_env(), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "http"}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", HAND_OVER, str(fd), *self.argv()],
                stdout=log,
                stderr=log,
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(fd,),
            )

    def child_env(self) -> dict[str, str]:
        # a harness's server leaves nothing running when stopped, unless the caller asks (extra_env)
        return {**os.environ, "CRYOBOX_API_KEY": self.api_key, "CRYOBOX_ON_STOP": "kill", **self.extra_env}

    def ready(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200

    def env(self) -> dict[str, str]:
        """What a client of this server needs: ``CRYOBOX_API_URL`` and ``CRYOBOX_API_KEY``."""
        return {"CRYOBOX_API_URL": self.url, "CRYOBOX_API_KEY": self.api_key}

    def cleanup(self) -> None:
        """After :meth:`stop`: unmount the data volume and remove the hot directory, even if serve died
        without doing it (a kill -9, a crash)."""
        release_serve_state(self.data_dir, self.cache_dir)
