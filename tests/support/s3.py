"""A real S3 for tests: a moto server subprocess on 127.0.0.1, and a throttling reverse proxy in front of it.

``moto_server()`` starts ``python -m moto.server -H 127.0.0.1 -p 0`` (the OS picks a free port, read back from
the server's log) and always kills it on exit (the kernel kills it too should the test process die first).
``throttling_proxy(upstream)`` is a small threaded HTTP server on 127.0.0.1 that forwards every request to moto,
except the GETs its ``ThrottlePolicy`` picks: those are answered with a real S3 ``503 SlowDown`` error body (or
429 / 500 / ...). Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, urlsplit

from cryobox.objstore.client import ObjectStore, open_store

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_RUNNING = re.compile(rb"Running on http://127\.0\.0\.1:(\d+)")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
_ERROR_CODES = {429: "SlowDown", 500: "InternalError", 503: "SlowDown"}
_REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 503: "Slow Down"}


def s3_error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{secrets.token_hex(8)}</RequestId><HostId>cryobox-test-proxy</HostId></Error>"
    ).encode()


def _request(endpoint: str, method: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One plain HTTP request to 127.0.0.1 (http.client: no proxy environment variables are consulted)."""
    parts = urlsplit(endpoint)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@dataclass
class MotoServer:
    endpoint: str  # http://127.0.0.1:<port>

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"cryobox-test-{secrets.token_hex(4)}"
        status, body = _request(self.endpoint, "PUT", f"/{quote(name)}")
        if status != 200:
            raise RuntimeError(f"moto refused bucket {name}: {status} {body[:200]!r}")
        return name

    def url(self, bucket: str, endpoint: str | None = None) -> str:
        return f"s3://{bucket}?endpoint={endpoint or self.endpoint}&region={REGION}"

    def open(self, bucket: str, endpoint: str | None = None) -> ObjectStore:
        """An ``ObjectStore`` on ``bucket``, talking to moto (or to ``endpoint``, e.g. a throttling proxy)."""
        return open_store(self.url(bucket, endpoint), env=CREDENTIALS)


@contextmanager
def moto_server(startup_timeout_s: float = 30.0) -> Iterator[MotoServer]:
    """A moto S3 server subprocess on 127.0.0.1; killed (and reaped) on exit whatever happens."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            yield MotoServer(_wait_ready(proc, log.fileno(), startup_timeout_s))
        finally:
            proc.kill()
            proc.wait(timeout=10)


def _die_with_parent() -> None:
    """In the child: SIGKILL me if the test process dies without running its finalizers (prctl PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def _wait_ready(proc: subprocess.Popen[bytes], log_fd: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = os.pread(log_fd, 1 << 16, 0)
        match = _RUNNING.search(text)
        if match:
            endpoint = f"http://127.0.0.1:{int(match.group(1))}"
            try:
                if _request(endpoint, "GET", "/moto-api/", timeout=1.0)[0] < 500:
                    return endpoint
            except OSError:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited ({proc.returncode}): {text[-2000:].decode(errors='replace')}")
        time.sleep(0.05)
    raise RuntimeError(f"moto server not ready within {timeout_s}s")


@dataclass
class ThrottlePolicy:
    """Which GETs the proxy refuses: the first ``first`` of them, and every ``every``-th one (1 = all)."""

    first: int = 0
    every: int = 0
    status: int = 503
    delay_s: float = 0.0  # added before every forwarded GET (to observe concurrency)

    def refuses(self, n: int) -> bool:  # n counts GETs from 1
        return n <= self.first or (self.every > 0 and n % self.every == 0)


@dataclass
class ProxyCounters:
    requests: dict[str, int] = field(default_factory=dict)  # by method, including refused ones
    refused: int = 0


class ThrottlingProxy:
    """A reverse proxy on 127.0.0.1 in front of ``upstream``; see the module doc. Thread-safe counters."""

    def __init__(self, upstream: str, policy: ThrottlePolicy | None = None) -> None:
        self.upstream = urlsplit(upstream)
        self.policy = policy or ThrottlePolicy()
        self.counters = ProxyCounters()
        self._lock = threading.Lock()
        self._gets = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="s3-proxy", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def set_policy(self, policy: ThrottlePolicy) -> None:
        """Replace the policy and restart the GET count (so ``first`` counts from now)."""
        with self._lock:
            self.policy = policy
            self._gets = 0

    def count(self, method: str) -> int:
        with self._lock:
            return self.counters.requests.get(method, 0)

    def admit(self, method: str) -> tuple[ThrottlePolicy, bool]:
        """Count one request; return the policy in force and whether to refuse it."""
        with self._lock:
            self.counters.requests[method] = self.counters.requests.get(method, 0) + 1
            if method != "GET":
                return self.policy, False
            self._gets += 1
            refuse = self.policy.refuses(self._gets)
            self.counters.refused += int(refuse)
            return self.policy, refuse


def _handler_for(proxy: ThrottlingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (signature of the base class)
            pass

        def do_GET(self) -> None:
            self._relay()

        def do_HEAD(self) -> None:
            self._relay()

        def do_PUT(self) -> None:
            self._relay()

        def do_POST(self) -> None:
            self._relay()

        def do_DELETE(self) -> None:
            self._relay()

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _relay(self) -> None:
            body = self._body()
            policy, refuse = proxy.admit(self.command)
            if refuse:
                code = _ERROR_CODES.get(policy.status, "ServiceUnavailable")
                payload = s3_error_body(code, "Please reduce your request rate.")
                self._answer(policy.status, _REASONS.get(policy.status, "Error"), [], payload)
                return
            if self.command == "GET" and policy.delay_s > 0:
                time.sleep(policy.delay_s)
            host, port = proxy.upstream.hostname or "127.0.0.1", proxy.upstream.port or 80
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                headers.pop("Content-Length", None)
                conn.request(
                    self.command, self.path, body=body if body or self.command != "GET" else None, headers=headers
                )
                resp = conn.getresponse()
                data = resp.read()
                kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
                self._answer(resp.status, resp.reason, kept, data)
            finally:
                conn.close()

        def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response_only(status, reason)
            for key, value in headers:
                if key.lower() == "content-length" and self.command != "HEAD":
                    continue  # recomputed below; a HEAD keeps the object's length
                self.send_header(key, value)
            if self.command != "HEAD" or not any(k.lower() == "content-length" for k, _ in headers):
                self.send_header("Content-Length", str(len(body)))
            if status >= 400 and not headers:
                self.send_header("Content-Type", "application/xml")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


@contextmanager
def throttling_proxy(upstream: str, policy: ThrottlePolicy | None = None) -> Iterator[ThrottlingProxy]:
    proxy = ThrottlingProxy(upstream, policy)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()
