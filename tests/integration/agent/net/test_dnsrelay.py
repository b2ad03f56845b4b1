"""The DNS relay on a slot's gateway (root): a guest's queries over UDP and TCP reach the upstream and come back;
without a relay they are refused at once (the slot's input chain lets DNS to the gateway through, nothing else).

The "guest" is a netns veth-paired to the slot in place of its tap; the upstream is a resolver stand-in on the
host's loopback that answers ``b"ANS:" + query``. No traffic leaves the machine."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from cryobox.agent.net import GATEWAY_IP, SlotPlan, create_slot, reclaim
from cryobox.agent.net.dnsrelay import Upstream, dns_relay, host_resolvers
from tests.support.netutil import attach_fake_guest, in_thread_netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nft need root")


class FakeResolver:
    """UDP and TCP on 127.0.0.1:<port>, answering every query with ``b"ANS:" + query``."""

    def __init__(self) -> None:
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.port = self.udp.getsockname()[1]
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", self.port))
        self.tcp.listen(4)
        self.queries: list[bytes] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve_udp), threading.Thread(target=self._serve_tcp)]
        for thread in self._threads:
            thread.start()

    def _serve_udp(self) -> None:
        self.udp.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data, peer = self.udp.recvfrom(4096)
            except TimeoutError:
                continue
            self.queries.append(data)
            self.udp.sendto(b"ANS:" + data, peer)

    def _serve_tcp(self) -> None:
        self.tcp.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                (length,) = struct.unpack("!H", conn.recv(2))
                query = conn.recv(length)
                self.queries.append(query)
                answer = b"ANS:" + query
                conn.sendall(struct.pack("!H", len(answer)) + answer)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self.udp.close()
        self.tcp.close()


@pytest.fixture
def resolver() -> Iterator[FakeResolver]:
    fake = FakeResolver()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def guest_ns() -> Iterator[tuple[str, str]]:
    """(slot netns, guest netns) of a fresh slot with a fake guest plugged into it."""
    tag = secrets.token_hex(3)
    plan = SlotPlan(tag, f"10.{random.randint(230, 239)}.0.0/16")
    try:
        slot = plan.slot(0)
        create_slot(slot)
        yield slot.netns, attach_fake_guest(slot)
    finally:
        reclaim(tag)


def udp_query(ns: str, query: bytes) -> bytes:
    def ask() -> bytes:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(3)
            sock.connect((GATEWAY_IP, 53))
            sock.send(query)
            return sock.recv(4096)

    return in_thread_netns(ns, ask)


def tcp_query(ns: str, query: bytes) -> bytes:
    def ask() -> bytes:
        with socket.create_connection((GATEWAY_IP, 53), timeout=3) as sock:
            sock.sendall(struct.pack("!H", len(query)) + query)
            (length,) = struct.unpack("!H", sock.recv(2))
            data = b""
            while len(data) < length:
                data += sock.recv(length - len(data))
            return data

    return in_thread_netns(ns, ask)


async def test_the_relay_answers_a_guest_over_udp_and_tcp(guest_ns: tuple[str, str], resolver: FakeResolver) -> None:
    slot_ns, guest = guest_ns
    async with dns_relay(slot_ns, Upstream("127.0.0.1", resolver.port)):
        assert await asyncio.to_thread(udp_query, guest, b"\x12\x34udp-query") == b"ANS:\x12\x34udp-query"
        assert await asyncio.to_thread(tcp_query, guest, b"\x56\x78tcp-query") == b"ANS:\x56\x78tcp-query"
    assert resolver.queries == [b"\x12\x34udp-query", b"\x56\x78tcp-query"]
    # closed with the context: the port is free again, and queries are refused, not relayed
    with pytest.raises(ConnectionRefusedError):
        await asyncio.to_thread(udp_query, guest, b"late")
    assert len(resolver.queries) == 2


async def test_without_a_relay_dns_is_refused_at_once_and_other_ports_stay_dropped(
    guest_ns: tuple[str, str],
) -> None:
    _, guest = guest_ns
    with pytest.raises(ConnectionRefusedError):  # let through the input chain, nobody listens: ICMP unreachable
        await asyncio.to_thread(udp_query, guest, b"q")

    def other_port() -> None:
        with socket.create_connection((GATEWAY_IP, 22), timeout=1):
            pass

    with pytest.raises(TimeoutError):  # dropped by the slot's input chain as before
        await asyncio.to_thread(in_thread_netns, guest, other_port)


def test_host_resolvers_reads_ipv4_nameservers(tmp_path: os.PathLike[str]) -> None:
    conf = os.path.join(tmp_path, "resolv.conf")
    with open(conf, "w") as fh:
        fh.write("# comment\nnameserver 192.0.2.53\nnameserver ::1\nsearch example\nnameserver 127.0.0.53\n")
    from pathlib import Path

    assert host_resolvers(Path(conf)) == ["192.0.2.53", "127.0.0.53"]
