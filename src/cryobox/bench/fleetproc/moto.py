"""The fleet's S3 object store: a moto server (:class:`MotoProcess`) on the root namespace's loopback."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, urlsplit

import httpx

from .system import die_with_parent

REGION = "us-east-1"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_MOTO_RUNNING = re.compile(r"Running on http://(\d+\.\d+\.\d+\.\d+):(\d+)")


def parse_moto_endpoint(log_text: str, host: str = "127.0.0.1") -> str | None:
    """``http://<host>:<port>`` from moto's (werkzeug's) "Running on http://A:P" line for ``host``, if printed."""
    for match in _MOTO_RUNNING.finditer(log_text):
        if match.group(1) == host:
            return f"http://{host}:{int(match.group(2))}"
    return None


def s3_store_url(bucket: str, endpoint: str, region: str = REGION) -> str:
    return f"s3://{bucket}?endpoint={endpoint}&region={region}"


class MotoProcess:
    """``python -m moto.server -H <host> -p 0``; the port is read back from its log. Killed on ``stop()``."""

    def __init__(self, *, host: str = "127.0.0.1", log_path: Path | None = None, start_timeout_s: float = 30.0) -> None:
        self.host = host
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.endpoint = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fd: int | None = None

    @property
    def port(self) -> int:
        return int(urlsplit(self.endpoint).port or 0)

    def start(self) -> MotoProcess:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            fd = os.open(tempfile.gettempdir(), os.O_RDWR | os.O_TMPFILE, 0o600)
        self._log_fd = fd
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", "0"],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        try:
            self.endpoint = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> str:
        assert self.proc is not None and self._log_fd is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            text = os.pread(self._log_fd, 1 << 16, 0).decode(errors="replace")
            endpoint = parse_moto_endpoint(text, self.host)
            if endpoint:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{endpoint}/moto-api/", timeout=1.0, trust_env=False).status_code < 500:
                        return endpoint
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited ({self.proc.returncode}): {text[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"moto server not ready within {self.start_timeout_s}s")

    def create_bucket(self, name: str | None = None) -> str:
        """An empty bucket (moto accepts an unsigned ``PUT /<bucket>``)."""
        name = name or f"cryobox-fleet-{secrets.token_hex(4)}"
        response = httpx.put(f"{self.endpoint}/{quote(name)}", timeout=10.0, trust_env=False)
        if response.status_code != 200:
            raise RuntimeError(f"moto refused bucket {name}: {response.status_code} {response.text[:200]}")
        return name

    def store_url(self, bucket: str) -> str:
        return s3_store_url(bucket, self.endpoint)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def __enter__(self) -> MotoProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
