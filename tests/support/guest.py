"""The guest agent in this process: it serves one end of a socketpair in a thread, the tests drive the other with
a sync :class:`Client` (:class:`Mux`: several requests in flight on it), or the agent's own ``GuestClient``
(:class:`AsyncGuest`)."""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from cryobox.agent.guest.client import READ_BUFFER, GuestClient
from cryobox.guest.agent import GuestAgent
from cryobox.guest.protocol import HEADER, decode_body, decode_length, encode


class Client:
    """Synchronous test client: sends requests and reads frames from its end of the socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(10.0)
        self.next_id = 0
        self.buf = b""

    def send(self, op: str, args: dict[str, Any] | None = None) -> int:
        self.next_id += 1
        self.sock.sendall(encode({"id": self.next_id, "op": op, "args": args or {}}))
        return self.next_id

    def _read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("agent closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def recv(self) -> dict[str, Any]:
        length = decode_length(self._read_exact(HEADER.size))
        return decode_body(self._read_exact(length))

    def call_full(self, op: str, args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """All frames for one request, events first, final reply last."""
        req_id = self.send(op, args)
        frames: list[dict[str, Any]] = []
        while True:
            frame = self.recv()
            assert frame["id"] == req_id
            frames.append(frame)
            if "ok" in frame:
                return frames

    def call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call_full(op, args)[-1]

    def ok(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.call(op, args)
        assert reply["ok"] is True, reply
        result: dict[str, Any] = reply["result"]
        return result

    def error_code(self, op: str, args: dict[str, Any] | None = None) -> str:
        reply = self.call(op, args)
        assert reply["ok"] is False, reply
        code: str = reply["error"]["code"]
        return code


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Harness:
    def __init__(self, agent: GuestAgent) -> None:
        self.agent = agent
        self.agent_sock, client_sock = socket.socketpair()
        self.client = Client(client_sock)
        self.served: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.served.append(agent.serve_socket(self.agent_sock)), daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.client.sock.close()
        self.thread.join(timeout=5)
        self.agent_sock.close()


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"  # an unreaped zombie is dead too
    except FileNotFoundError:
        return True


class AsyncGuest:
    """The real agent behind a ``GuestClient``: served in a thread over a socketpair wrapped in asyncio streams."""

    def __init__(self, agent: GuestAgent) -> None:
        self.agent = agent
        self.cancels: list[Any] = []
        original = agent._ops["cancel"]

        def recording(args: dict[str, Any], emit: Any) -> dict[str, Any]:
            self.cancels.append(args.get("request"))
            return original(args, emit)

        agent.register("cancel", recording)
        self.agent_sock, self.host_sock = socket.socketpair()
        self.thread = threading.Thread(target=agent.serve_socket, args=(self.agent_sock,), daemon=True)
        self.thread.start()

    async def client(self) -> GuestClient:
        reader, writer = await asyncio.open_connection(sock=self.host_sock, limit=READ_BUFFER)
        return GuestClient(reader, writer, "test")

    def close(self) -> None:
        self.thread.join(timeout=5)
        self.agent_sock.close()


class Mux:
    """Several requests in flight on one connection: frames are kept per request id as they arrive."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.frames: dict[int, list[dict[str, Any]]] = defaultdict(list)

    def send(self, op: str, args: dict[str, Any]) -> int:
        return self.client.send(op, args)

    def _until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out; frames so far: {dict(self.frames)}"
            frame = self.client.recv()
            self.frames[frame["id"]].append(frame)

    def final(self, req_id: int, timeout: float = 10.0) -> dict[str, Any]:
        self._until(lambda: any("ok" in f for f in self.frames[req_id]), timeout)
        return self.frames[req_id][-1]

    def events(self, req_id: int) -> list[tuple[str, bytes]]:
        return [(f["event"], base64.b64decode(f["data"])) for f in self.frames[req_id] if "event" in f]

    def wait_events(self, req_id: int, done: Callable[[list[tuple[str, bytes]]], bool]) -> list[tuple[str, bytes]]:
        self._until(lambda: done(self.events(req_id)))
        return self.events(req_id)

    def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        return self.final(self.send(op, args))

    def ok(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        reply = self.call(op, args)
        assert reply["ok"] is True, reply
        result: dict[str, Any] = reply["result"]
        return result

    def code(self, op: str, args: dict[str, Any]) -> str:
        reply = self.call(op, args)
        assert reply["ok"] is False, reply
        code: str = reply["error"]["code"]
        return code
