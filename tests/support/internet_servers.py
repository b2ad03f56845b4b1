"""The stand-in internet's servers (:mod:`tests.support.internet`): plain threads over sockets made inside its
network namespace (a socket keeps its netns whatever thread uses it, so nothing here runs in the namespace).

One hub thread waits on every listening and datagram socket; every TCP connection gets a thread of its own, so a
slow client (a 1 GiB blob, a handshake never finished) holds up nobody else. Stopping shuts every connection a
client still holds open and joins every thread: a test that ends leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.internet_tls import ServerTls

StreamHandler = Callable[[socket.socket, "str | None"], None]
"""Serves one TCP connection: the socket (TLS already negotiated, if the service is HTTPS) and the SNI. The hub
closes the socket afterwards; handlers never do (stopping shuts what is still open)."""
DatagramHandler = Callable[[bytes], "bytes | None"]
"""The reply to one datagram (None: none)."""

BANNER = b"SSH-2.0-test\r\n"
_CHUNK = 64 * 1024
_BLOB = bytes(range(256)) * (_CHUNK // 256)  # not zeros: a compressing hop would make a throughput figure lie


@dataclass(frozen=True)
class Service:
    """One socket to open in the namespace and what serves it."""

    name: str
    """Names the threads serving it (after the internet's prefix)."""
    family: socket.AddressFamily
    kind: socket.SocketKind
    address: str
    port: int
    stream: StreamHandler | None = None
    datagram: DatagramHandler | None = None
    tls: ServerTls | None = None

    def open(self) -> socket.socket:
        """The bound (and, for TCP, listening) socket; call it in the namespace."""
        sock = socket.socket(self.family, self.kind)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((self.address, self.port))
            if self.kind == socket.SOCK_STREAM:
                sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock


class Hub:
    """Runs :class:`Service` sockets until :meth:`stop`. Thread names start with ``prefix``; an exception a
    handler raises (other than a connection error, a client's doing) lands in :attr:`errors`."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._loop: threading.Thread | None = None
        self.errors: list[BaseException] = []

    def add(self, service: Service, sock: socket.socket) -> None:
        """Serve ``sock`` (made by ``service.open()``); the hub owns it from now on."""
        self._sockets.append(sock)
        self._selector.register(sock, selectors.EVENT_READ, service)

    def start(self) -> None:
        self._loop = threading.Thread(target=self._run, name=f"{self._prefix}hub", daemon=True)
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> list[str]:
        """Stop serving, end every connection and join every thread; idempotent. Returns the names of threads
        still alive after ``timeout`` (none, unless a handler is stuck somewhere a closed socket cannot reach)."""
        with self._lock:
            self._stopping = True
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(conn, socket.SHUT_RDWR)  # the fd's, not SSLSocket's (that drops TLS state)
            threads = list(self._threads)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._loop is not None:
            self._loop.join(timeout)
            threads.append(self._loop)
        for thread in threads:
            thread.join(timeout)
        stuck = [t.name for t in threads if t.is_alive()]
        if not stuck:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
        return stuck

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                service = key.data
                if service is None:
                    return
                sock = key.fileobj
                assert isinstance(service, Service) and isinstance(sock, socket.socket)
                try:
                    if service.kind == socket.SOCK_STREAM:
                        self._accept(service, sock)
                    else:
                        self._datagrams(service, sock)
                except OSError:
                    pass  # a client gone before we got to it
                except Exception as exc:
                    self.errors.append(exc)

    def _accept(self, service: Service, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        with self._lock:
            if self._stopping:
                conn.close()
                return
            self._conns.add(conn)
            thread = threading.Thread(
                target=self._serve, args=(service, conn), name=f"{self._prefix}{service.name}", daemon=True
            )
            self._threads.add(thread)
            thread.start()  # under the lock: stop() never sees a thread it cannot join

    def _serve(self, service: Service, conn: socket.socket) -> None:
        current = conn
        try:
            sni = None
            if service.tls is not None:
                tls = service.tls.wrap(conn)  # takes over conn's fd
                with self._lock:
                    self._conns.discard(conn)
                    self._conns.add(tls)
                    current = tls
                    if self._stopping:
                        return
                sni = service.tls.handshake(tls)
            assert service.stream is not None
            service.stream(current, sni)
        except OSError:
            pass  # the client hung up, reset or failed TLS; or the internet is stopping
        except Exception as exc:
            self.errors.append(exc)
        finally:
            with self._lock:
                self._conns.discard(current)
                self._threads.discard(threading.current_thread())
                current.close()  # under the lock: stop() never shuts an fd number reused by then

    def _datagrams(self, service: Service, sock: socket.socket) -> None:
        assert service.datagram is not None
        while True:
            try:
                data, peer = sock.recvfrom(65536)
            except BlockingIOError:
                return
            reply = service.datagram(data)
            if reply is not None:
                sock.sendto(reply, peer)


def echo(data: bytes) -> bytes:
    return data


def banner_echo(conn: socket.socket, _sni: str | None) -> None:
    """What a non-HTTP server looks like to a proxy (SSH speaks first): the banner, then everything echoed."""
    conn.sendall(BANNER)
    while chunk := conn.recv(_CHUNK):
        conn.sendall(chunk)


def http(conn: socket.socket, sni: str | None) -> None:
    """HTTP/1.1 (keep-alive) on ``conn``; see :class:`_Http`."""
    _Http(conn, sni)


_NO_SERVER = socketserver.BaseServer(("", 0), BaseHTTPRequestHandler)
"""The handler wants a server object; ours keeps nothing in it (and makes no socket)."""


class _Http(BaseHTTPRequestHandler):
    """Answers any method on any path with JSON saying what arrived where: {"server": the local address reached,
    "host": the Host header, "sni": the TLS SNI or null, "path": the request target as sent, "bytes": the request
    body's length (Content-Length or chunked)}. ``/blob?size=N`` streams N bytes instead."""

    protocol_version = "HTTP/1.1"
    server_version = "cryobox-internet"
    sys_version = ""

    def __init__(self, conn: socket.socket, sni: str | None) -> None:
        self.sni = sni
        self.local = str(conn.getsockname()[0])
        super().__init__(conn, conn.getpeername(), _NO_SERVER)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a test's output is no place for an access log

    def do_GET(self) -> None:
        self._respond()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = do_GET

    def _respond(self) -> None:
        url = urlsplit(self.path)
        try:
            received = self._read_body()
            blob = int(parse_qs(url.query).get("size", ["0"])[0]) if url.path == "/blob" else None
        except ValueError:
            self.send_error(400)  # a malformed request is the client's doing, not an error of the internet's
            return
        if blob is not None:
            self._blob(blob)
            return
        body = json.dumps(
            {
                "server": self.local,
                "host": self.headers.get("Host"),
                "sni": self.sni,
                "path": self.path,
                "bytes": received,
            }  # fmt: skip
        ).encode()
        self._headers("application/json", len(body))
        if self.command != "HEAD":
            self.wfile.write(body)

    def _blob(self, size: int) -> None:
        self._headers("application/octet-stream", size)
        if self.command == "HEAD":
            return
        left = size
        while left > 0:
            self.wfile.write(_BLOB[: min(left, _CHUNK)])
            left -= min(left, _CHUNK)

    def _headers(self, content_type: str, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _read_body(self) -> int:
        """Reads the request body (it is only counted)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            total = 0
            while size := int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16):
                total += self._discard(size)
                self.rfile.readline(1024)  # the CRLF after the chunk
            while self.rfile.readline(1024).strip():
                pass  # trailers, up to the empty line
            return total
        return self._discard(int(self.headers.get("Content-Length") or 0))

    def _discard(self, size: int) -> int:
        left = size
        while left > 0:
            chunk = self.rfile.read(min(left, _CHUNK))
            if not chunk:
                raise ConnectionResetError("the client hung up mid-body")
            left -= len(chunk)
        return size
