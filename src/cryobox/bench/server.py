"""A real ``cryobox serve`` process for benchmarks and end-to-end tests, stopped by PID."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from ..agent.store.mounts import unmount
from ..agent.store.volume import release_volume
from ..config import DEFAULT_CACHE_DIR, Paths


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """Starts ``cryobox serve`` on a free loopback port with its own data dir; ``stop()`` is idempotent."""

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
    ) -> None:
        self.data_dir = data_dir
        self.cache_dir = cache_dir
        self.prespawn = prespawn
        self.pool_mode = pool_mode
        self.port = free_port()
        self.api_key = "cbx_test_" + secrets.token_hex(8)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or data_dir / "serve.log"
        self.extra_env = extra_env or {}
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 1800.0) -> ServeProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "cryobox.cli.main",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--prespawn",
            str(self.prespawn),
            "--pool-mode",
            self.pool_mode,
        ]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        argv += self.extra_args
        env = {**os.environ, "CRYOBOX_API_KEY": self.api_key, **self.extra_env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cryobox serve exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        self.cleanup()
        raise RuntimeError(f"cryobox serve did not come up within {timeout_s}s; see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def env(self) -> dict[str, str]:
        return {"CRYOBOX_API_URL": self.url, "CRYOBOX_API_KEY": self.api_key}

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def cleanup(self) -> None:
        """After :meth:`stop`: unmount the data volume and remove the hot directory, even if serve died
        without doing it (a kill -9, a crash)."""
        paths = Paths(self.data_dir, self.cache_dir or DEFAULT_CACHE_DIR)
        unmount(paths.memserver_dir / "mnt")  # a memory server killed with serve leaves its mount disconnected
        release_volume(self.data_dir)
        shutil.rmtree(paths.hot_dir, ignore_errors=True)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self.cleanup()
