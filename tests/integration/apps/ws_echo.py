"""A WebSocket echo server with the standard library only (RFC 6455: the handshake, masked client frames, text,
binary, ping and close), run inside a guest by the port-proxy tests: ``python3 ws_echo.py PORT``."""

from __future__ import annotations

import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def send_frame(conn: socket.socket, opcode: int, payload: bytes) -> None:
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack(">H", n)
    else:
        head += bytes([127]) + struct.pack(">Q", n)
    conn.sendall(head + payload)


def serve(conn: socket.socket) -> None:
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            return
        request += chunk
    headers = {}
    for line in request.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
    extra = ""
    if "sec-websocket-protocol" in headers:
        extra = f"Sec-WebSocket-Protocol: {headers['sec-websocket-protocol'].split(',')[0].strip()}\r\n"
    conn.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n"
            f"X-Seen-Authorization: {headers.get('authorization', '-')}\r\n{extra}\r\n"
        ).encode()
    )
    while True:
        b1, b2 = read_exact(conn, 2)
        opcode, masked, n = b1 & 0x0F, b2 & 0x80, b2 & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", read_exact(conn, 2))
        elif n == 127:
            (n,) = struct.unpack(">Q", read_exact(conn, 8))
        mask = read_exact(conn, 4) if masked else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exact(conn, n)))
        if opcode == 0x8:  # close: echo the code back
            send_frame(conn, 0x8, payload[:2] or struct.pack(">H", 1000))
            return
        if opcode == 0x9:
            send_frame(conn, 0xA, payload)
        elif opcode in (0x1, 0x2):
            send_frame(conn, opcode, payload)


def main() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", int(sys.argv[1])))
    listener.listen(16)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_safely, args=(conn,), daemon=True).start()


def serve_safely(conn: socket.socket) -> None:
    try:
        serve(conn)
    except (EOFError, OSError, KeyError):
        pass
    finally:
        conn.close()


if __name__ == "__main__":
    main()
