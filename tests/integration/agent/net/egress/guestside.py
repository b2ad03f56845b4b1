"""What a guest does, from a fake guest's network namespace (blocking; call through ``asyncio.to_thread``)."""

from __future__ import annotations

import json
import socket
import ssl
from typing import Any

import dns.message
import dns.query
import dns.rcode

from cryobox.agent.net import GATEWAY_IP
from tests.support.netutil import in_thread_netns, socket_in

DENIED = "denied"


def http(guest: str, ip: str, host: str | None, *, port: int = 80, path: str = "/", timeout: float = 5.0) -> Any:
    """GET ``path`` from ``ip:port`` with ``Host: host`` (none: no Host header): the server's JSON, or DENIED when
    the connection was refused or reset before an answer."""
    sock = socket_in(guest)
    sock.settimeout(timeout)
    try:
        sock.connect((ip, port))
        head = f"GET {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host else "") + "Connection: close\r\n\r\n"
        sock.sendall(head.encode())
        data = _read_all(sock)
    except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
        return DENIED
    finally:
        sock.close()
    if not data:
        return DENIED
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


def https(guest: str, ip: str, sni: str | None, context: ssl.SSLContext, *, timeout: float = 5.0) -> Any:
    """GET / over TLS to ``ip:443`` sending SNI ``sni`` (the certificate is checked against ``sni``)."""
    sock = socket_in(guest)
    sock.settimeout(timeout)
    try:
        sock.connect((ip, 443))
        context.check_hostname = sni is not None
        with context.wrap_socket(sock, server_hostname=sni) as tls:
            tls.sendall(f"GET / HTTP/1.1\r\nHost: {sni or ip}\r\nConnection: close\r\n\r\n".encode())
            data = _read_all(tls)
    except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError, ssl.SSLError):
        return DENIED
    finally:
        sock.close()
    return json.loads(data.split(b"\r\n\r\n", 1)[1]) if data else DENIED


def raw(guest: str, ip: str, port: int, *, timeout: float = 3.0) -> str:
    """Connect and read what the server says first: its banner, or DENIED / "timeout"."""
    sock = socket_in(guest)
    sock.settimeout(timeout)
    try:
        sock.connect((ip, port))
        data = sock.recv(64)
        return data.decode(errors="replace") if data else DENIED
    except (ConnectionRefusedError, ConnectionResetError):
        return DENIED
    except TimeoutError:
        return "timeout"
    finally:
        sock.close()


def raw6(guest: str, ip: str, port: int, *, timeout: float = 2.0) -> str:
    """A TCP connect over IPv6: "ok", "refused", "timeout" (dropped) or "unreachable" (no route)."""

    def go() -> str:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect((ip, port))
                return "ok"
            except ConnectionRefusedError:
                return "refused"
            except TimeoutError:
                return "timeout"
            except OSError as err:
                return "unreachable" if err.errno in (101, 113) else f"errno-{err.errno}"

    return in_thread_netns(guest, go)


def udp(guest: str, ip: str, port: int, *, timeout: float = 1.0) -> str:
    def go() -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(timeout)
            sock.sendto(b"ping", (ip, port))
            try:
                return sock.recv(64).decode()
            except TimeoutError:
                return "timeout"
            except ConnectionRefusedError:
                return "refused"

    return in_thread_netns(guest, go)


def resolve(guest: str, name: str, *, server: str = GATEWAY_IP, tcp: bool = False) -> list[str] | str:
    """A records of ``name`` from ``server`` (the guest's resolver by default), or the rcode's name, or "timeout"."""

    def go() -> list[str] | str:
        query = dns.message.make_query(name, "A")
        try:
            answer = (dns.query.tcp if tcp else dns.query.udp)(query, server, timeout=2.0)
        except (TimeoutError, dns.exception.Timeout, OSError):
            return "timeout"
        if answer.rcode() != dns.rcode.NOERROR:
            return dns.rcode.to_text(answer.rcode())
        return sorted(r.address for rrset in answer.answer for r in rrset if rrset.rdtype == 1)

    return in_thread_netns(guest, go)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def open_download(guest: str, ip: str, host: str, *, size: int = 8 * 2**30, timeout: float = 5.0) -> socket.socket:
    """Start a download of ``size`` bytes and read its headers and first bytes; the caller reads on (``read``)."""
    sock = socket_in(guest)
    sock.settimeout(timeout)
    sock.connect((ip, 80))
    sock.sendall(f"GET /blob?size={size} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    read(sock, 65536)
    return sock


def read(sock: socket.socket, n: int) -> int:
    """Read ``n`` bytes (fewer only at the end of the stream); how many came."""
    got = 0
    while got < n:
        chunk = sock.recv(min(65536, n - got))
        if not chunk:
            break
        got += len(chunk)
    return got
