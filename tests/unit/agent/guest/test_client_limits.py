"""What a hostile guest can make the host hold: frame limits, bounded queues with backpressure, violations."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cryobox.agent.guest.client import QUEUE_FRAMES, READ_BUFFER, SMALL_REPLY, STREAM_EVENT, GuestClient
from cryobox.agent.snapshot import evidence
from cryobox.agent.vm.consolelog import cap, cap_all, tail_files
from cryobox.errors import GuestError
from cryobox.guest import protocol


class Guest:
    """The guest end of the socket pair: reads requests, writes whatever frames a test wants."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(sock=self.sock)

    async def request(self) -> dict[str, object]:
        header = await self.reader.readexactly(4)
        body = await self.reader.readexactly(protocol.decode_length(header))
        message: dict[str, object] = json.loads(body)
        return message

    async def send(self, message: dict[str, object]) -> None:
        self.writer.write(protocol.encode(message))
        await self.writer.drain()

    async def raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[GuestClient, Guest, list[str]]]:
    host_sock, guest_sock = socket.socketpair()
    violations: list[str] = []
    reader, writer = await asyncio.open_connection(sock=host_sock, limit=READ_BUFFER)
    client = GuestClient(reader, writer, "t", violations.append)
    guest = Guest(guest_sock)
    await guest.connect()
    try:
        yield client, guest, violations
    finally:
        await client.aclose()
        guest.writer.close()


async def _wait_closed(client: GuestClient) -> None:
    async with asyncio.timeout(5):
        while not client.closed:
            await asyncio.sleep(0.01)


async def test_an_unasked_for_large_frame_is_a_violation_caught_before_its_body(
    pair: tuple[GuestClient, Guest, list[str]],
) -> None:
    client, guest, violations = pair
    await guest.raw(struct.pack(">I", 120 << 20))  # announce 120 MiB, send nothing else
    await _wait_closed(client)
    assert violations and "125829120" in violations[0]
    with pytest.raises(GuestError, match="closed"):
        await client.call("ping")


async def test_a_call_may_allow_a_larger_reply(pair: tuple[GuestClient, Guest, list[str]]) -> None:
    client, guest, violations = pair
    big = "x" * (2 * SMALL_REPLY)

    async def answer() -> None:
        request = await guest.request()
        await guest.send({"id": request["id"], "ok": True, "result": {"content": big}})

    task = asyncio.create_task(answer())
    result = await client.call("read_file", {"path": "/x"}, timeout=5, max_reply=4 * SMALL_REPLY)
    await task
    assert result["content"] == big and not violations


async def test_an_oversized_stream_event_is_a_violation(pair: tuple[GuestClient, Guest, list[str]]) -> None:
    client, guest, violations = pair
    stream = client.stream("exec", {})
    first = asyncio.ensure_future(anext(stream))
    request = await guest.request()
    with contextlib.suppress(ConnectionError):  # the host hangs up mid-frame
        await guest.send({"id": request["id"], "event": "stdout", "data": "y" * (STREAM_EVENT + 10)})
    with pytest.raises(GuestError, match="went away"):  # the consumer learns the guest is gone
        await asyncio.wait_for(first, 5)
    await _wait_closed(client)
    assert violations and str(STREAM_EVENT) in violations[0]


async def test_garbage_is_a_violation(pair: tuple[GuestClient, Guest, list[str]]) -> None:
    client, guest, violations = pair
    await guest.raw(struct.pack(">I", 5) + b"{nope")
    await _wait_closed(client)
    assert len(violations) == 1


async def test_a_slow_consumer_stops_the_reading_and_the_guest_blocks(
    pair: tuple[GuestClient, Guest, list[str]],
) -> None:
    client, guest, violations = pair
    stream = client.stream("exec", {})
    first = asyncio.ensure_future(anext(stream))
    request = await guest.request()
    chunk = {"id": request["id"], "event": "stdout", "data": "z" * (64 << 10)}
    frame = protocol.encode(chunk)
    guest.sock.setblocking(False)
    sent = 0
    for _ in range(2000):  # 128 MiB offered; the host must stop taking it long before
        guest.writer.write(frame)
        try:
            await asyncio.wait_for(guest.writer.drain(), 0.5)
        except TimeoutError:
            break
        sent += 1
    assert sent < 200, f"the host took {sent} frames of 64 KiB without anyone reading them"
    buffered = len(client._reader._buffer)  # type: ignore[attr-defined]
    assert buffered <= 2 * READ_BUFFER + len(frame)
    assert (await first)["event"] == "stdout"  # and it is all still there, in order, when the consumer reads
    for _ in range(QUEUE_FRAMES):
        assert (await asyncio.wait_for(anext(stream), 5))["event"] == "stdout"
    assert not violations
    await stream.aclose()  # type: ignore[attr-defined]


def test_console_log_rotation_keeps_the_newest_bytes(tmp_path: Path) -> None:
    log = tmp_path / "vm" / "console.log"
    log.parent.mkdir()
    log.write_bytes(b"a" * 1000 + b"b" * 1000)
    assert not cap(log, max_bytes=4000, keep_bytes=500)
    assert cap(log, max_bytes=1500, keep_bytes=500)
    assert log.stat().st_size == 0 and (tmp_path / "vm" / "console.log.1").read_bytes() == b"b" * 500
    with open(log, "ab") as fh:
        fh.write(b"c" * 10)
    assert tail_files(log) == [tmp_path / "vm" / "console.log.1", log]
    assert cap_all(tmp_path, max_bytes=5) == 1  # only console.log is over 5 bytes? the .1 file is not a log
    assert (tmp_path / "vm" / "console.log.1").read_bytes() == b"c" * 10


def test_evidence_keeps_at_most_the_cap_of_the_newest_log_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evidence, "MAX_BYTES", 12)
    log = tmp_path / "console.log"
    (tmp_path / "console.log.1").write_bytes(b"0123456789")
    log.write_bytes(b"abcdef")
    snap = tmp_path / "snap"
    snap.mkdir()
    evidence.collect_logs(snap, {"console.log": log, "qemu.log": tmp_path / "missing.log"})
    assert (snap / "evidence" / "console.log").read_bytes() == b"456789abcdef"
    assert not (snap / "evidence" / "qemu.log").exists()


async def test_a_posted_request_goes_out_before_the_next_call_and_is_forgotten_answered_or_not(
    pair: tuple[GuestClient, Guest, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """``post`` (the clock's refinement after a rejoin) does not wait for its reply, yet its frame precedes the
    next call's on the wire; a guest that never answers it cannot make the host hold its request for longer than
    its timeout, and a failed one is logged."""
    client, guest, _ = pair
    await client.post("set_clock", {"epoch_ns": 1}, timeout=0.2)
    calling = asyncio.ensure_future(client.call("ping"))
    first, second = await guest.request(), await guest.request()
    assert (first["op"], second["op"]) == ("set_clock", "ping")
    await guest.send({"id": second["id"], "ok": True, "result": {"pong": True}})
    assert await calling == {"pong": True}  # answered while the posted one still waits
    async with asyncio.timeout(5):
        while client._queues:
            await asyncio.sleep(0.02)
    assert "did not answer set_clock within 0.2s" in caplog.text
    await client.post("set_clock", {"epoch_ns": 2}, timeout=5)
    third = await guest.request()
    await guest.send({"id": third["id"], "ok": False, "error": {"code": "permission_denied", "message": "no clock"}})
    async with asyncio.timeout(5):
        while client._queues:
            await asyncio.sleep(0.02)
    assert "guest set_clock failed: no clock" in caplog.text
