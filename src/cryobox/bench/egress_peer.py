"""The two ends of ``cryobox bench net``'s egress section that are not the proxy: the server and the guest-side
client. Each runs in a process of its own (``python -m cryobox.bench.egress_peer serve|client SPEC``) that enters
its network namespace itself, so neither competes with the proxy for the bench process's GIL: what the bench
measures is the proxy's relay, not Python threads taking turns. The client functions also run on a thread of the
bench process (:func:`run_client` from a fresh thread), to show what that contention would cost.

The server (threads, sockets made in its namespace): on ``echo_port`` one byte at once, then an echo; on
``bulk_port`` one byte, then as many bytes as the client asks for (8 bytes, big-endian) from a preallocated buffer;
on ``http_port`` an HTTP/1.1 responder answering ``GET /`` with a tiny body naming the ``Host`` it got; on
``dns_port`` (UDP) a name server answering ``dns_name`` with the server's address (what the proxy's resolver asks).

The client alternates the paths on every connection (direct, proxied, then proxied, direct, ...), so drift on the
machine hits both alike. It prints its samples as one JSON object.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

CLONE_NEWNET = 0x40000000
GREETING = b"!"
BULK_BUFFER = 4 * 1024 * 1024
RECV_BUFFER = 1024 * 1024
HTTP_BODY = b"ok"
PATHS = ("direct", "proxied")


def setns(path: str) -> None:
    """Move the calling thread into the network namespace at ``path`` (sockets it makes then live there)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


# --- the server ----------------------------------------------------------------------------------------------------


def _listen(ip: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, port))
    sock.listen(512)
    return sock


def _echo(conn: socket.socket) -> None:
    conn.sendall(GREETING)
    while data := conn.recv(65536):
        conn.sendall(data)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            raise ConnectionError("peer closed early")
        got += chunk
    return got


def _bulk(conn: socket.socket, buffer: memoryview) -> None:
    conn.sendall(GREETING)
    (left,) = struct.unpack("!Q", _recv_exact(conn, 8))
    while left > 0:
        part = buffer[: min(left, len(buffer))]
        conn.sendall(part)
        left -= len(part)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the client's close: ours must not reset what is still in flight


def _http(conn: socket.socket) -> None:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            return
        head += chunk
    host = next(
        (line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"host:")), b""
    )
    body = HTTP_BODY + b" " + host
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _accept_loop(sock: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                handle(conn)
            except OSError:
                pass

    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _dns_loop(sock: socket.socket, name: str, address: str) -> None:
    while True:
        try:
            wire, peer = sock.recvfrom(4096)
        except OSError:
            return
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # not DNS: nothing to answer
            continue
        answer = dns.message.make_response(query)
        question = query.question[0] if query.question else None
        if question is not None and question.name.to_text().rstrip(".") == name:
            if question.rdtype == dns.rdatatype.A:
                answer.answer.append(dns.rrset.from_text(question.name, 300, "IN", "A", address))
        else:
            answer.set_rcode(dns.rcode.NXDOMAIN)
        sock.sendto(answer.to_wire(), peer)


def serve(spec: dict[str, Any]) -> None:
    """Serve until stdin closes (the bench's end, or its death)."""
    setns(spec["netns"])
    ip = spec["ip"]
    buffer = memoryview(bytearray(os.urandom(1024)) * (BULK_BUFFER // 1024))
    listeners = [
        (_listen(ip, spec["echo_port"]), _echo),
        (_listen(ip, spec["bulk_port"]), lambda conn: _bulk(conn, buffer)),
        (_listen(ip, spec["http_port"]), _http),
    ]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((ip, spec["dns_port"]))
    for sock, handle in listeners:
        threading.Thread(target=_accept_loop, args=(sock, handle), daemon=True).start()
    threading.Thread(target=_dns_loop, args=(udp, spec["dns_name"], ip), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()


# --- the client ----------------------------------------------------------------------------------------------------


def _connect(netns: str, ip: str, port: int) -> tuple[socket.socket, float]:
    """A connection from ``netns`` and the ms from ``connect()`` to the server's first byte."""
    setns(netns)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    started = time.perf_counter_ns()
    sock.connect((ip, port))
    if sock.recv(1) != GREETING:
        sock.close()
        raise ConnectionError(f"no greeting from {ip}:{port} (denied or reset)")
    return sock, (time.perf_counter_ns() - started) / 1e6


def _connect_ms(netns: str, ip: str, port: int) -> float:
    sock, ms = _connect(netns, ip, port)
    sock.close()
    return ms


def _http_ms(netns: str, ip: str, port: int, host: str) -> float:
    """From ``connect()`` to the whole response (by Content-Length, not the close) of one ``GET /``."""
    setns(netns)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    expected = f"{HTTP_BODY.decode()} {host}".encode()
    try:
        started = time.perf_counter_ns()
        sock.connect((ip, port))
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: cryobox-bench\r\n\r\n".encode())
        got = b""
        while not got.endswith(expected):
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"HTTP to {ip}:{port} as {host} ended early: {got[:200]!r}")
            got += chunk
        return (time.perf_counter_ns() - started) / 1e6
    finally:
        sock.close()


def _bulk_mbps(netns: str, ip: str, port: int, size: int, buffer: memoryview) -> float:
    """MB/s (1e6 B/s) of one connection receiving ``size`` bytes, from the request to the last byte."""
    sock, _ = _connect(netns, ip, port)
    try:
        started = time.perf_counter_ns()
        sock.sendall(struct.pack("!Q", size))
        got = 0
        while got < size:
            n = sock.recv_into(buffer)
            if not n:
                raise ConnectionError(f"bulk transfer ended after {got} of {size} bytes")
            got += n
        return size / ((time.perf_counter_ns() - started) / 1e9) / 1e6
    finally:
        sock.close()


def _alternating(rounds: int, paths: dict[str, str], measure: Callable[[str], float]) -> dict[str, list[float]]:
    """``measure(netns)`` ``rounds`` times per path, the order swapped every round."""
    out: dict[str, list[float]] = {p: [] for p in PATHS}
    for i in range(rounds):
        for path in PATHS if i % 2 == 0 else PATHS[::-1]:
            out[path].append(measure(paths[path]))
    return out


def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """One task of the client (``connect``, ``http`` or ``bulk``) on both paths; changes the calling thread's
    network namespace (run it on a thread that dies afterwards, or in a process of its own)."""
    paths, ip, task, warmup = spec["paths"], spec["ip"], spec["task"], int(spec.get("warmup", 10))
    if task == "connect":
        port = int(spec["port"])
        _alternating(warmup, paths, lambda ns: _connect_ms(ns, ip, port))
        return _alternating(int(spec["rounds"]), paths, lambda ns: _connect_ms(ns, ip, port))
    if task == "http":
        port, host = int(spec["port"]), str(spec["host"])
        _alternating(warmup, paths, lambda ns: _http_ms(ns, ip, port, host))
        return _alternating(int(spec["rounds"]), paths, lambda ns: _http_ms(ns, ip, port, host))
    if task == "bulk":
        port, buffer = int(spec["port"]), memoryview(bytearray(RECV_BUFFER))
        size = int(spec["size"])
        if size <= 0:  # as many bytes as the direct path moves in min_seconds, at least min_bytes
            rate = _bulk_mbps(paths["direct"], ip, port, int(spec["min_bytes"]) // 2, buffer)
            _bulk_mbps(paths["proxied"], ip, port, int(spec["min_bytes"]) // 8, buffer)
            step = 256 * 1024 * 1024
            want = max(int(spec["min_bytes"]), int(rate * 1e6 * float(spec["min_seconds"])))
            size = min(int(spec["max_bytes"]), -(-want // step) * step)
        rates = _alternating(int(spec["rounds"]), paths, lambda ns: _bulk_mbps(ns, ip, port, size, buffer))
        return {**rates, "bytes": size}
    raise ValueError(f"unknown client task {task!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("serve", "client"):
        print("usage: python -m cryobox.bench.egress_peer serve|client SPEC-JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    if argv[0] == "serve":
        serve(spec)
    else:
        print(json.dumps(run_client(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
