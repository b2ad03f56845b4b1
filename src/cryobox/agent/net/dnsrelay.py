"""A DNS relay on a slot's gateway address: what a guest's resolver (``nameserver 172.16.0.1``) talks to.

The relay's sockets belong to the slot's network namespace (a short-lived thread ``setns``-es there, binds and
exits); the agent's event loop serves them and forwards each query, as it is, to the host's own resolver from
the host's namespace (UDP queries over UDP, TCP queries over TCP; nothing is parsed). Build VMs use it so a
Dockerfile's ``apt-get``/``pip`` resolve names; the slot's firewall still decides what the guest may reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ...util.system import in_fresh_thread
from .slots import GATEWAY_IP, NETNS_DIR

log = logging.getLogger(__name__)
CLONE_NEWNET = 0x40000000
RESOLV_CONF = Path("/etc/resolv.conf")
UPSTREAM_TIMEOUT_S = 5.0
MAX_TCP_QUERY = 65535


def host_resolvers(resolv_conf: Path = RESOLV_CONF) -> list[str]:
    """The host's IPv4 name servers (``nameserver`` lines of ``resolv.conf``), loopback stubs included."""
    servers: list[str] = []
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver" and ":" not in fields[1]:
                servers.append(fields[1])
    return servers


def _sockets_in_netns(netns: str, address: str, port: int) -> tuple[socket.socket, socket.socket]:
    def make() -> tuple[socket.socket, socket.socket]:
        fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({netns}): {os.strerror(err)}")
        finally:
            os.close(fd)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            for sock in (udp, tcp):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                sock.setblocking(False)
            tcp.listen(16)
        except BaseException:
            udp.close()
            tcp.close()
            raise
        return udp, tcp

    return in_fresh_thread(make, name="cryobox-dns-netns")


@dataclass(frozen=True)
class Upstream:
    address: str
    port: int = 53


class _UdpRelay(asyncio.DatagramProtocol):
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()  # the socket is closed only now (asyncio closes it a loop turn after close())

    def datagram_received(self, data: bytes, addr: tuple[str | int, int]) -> None:
        task = asyncio.get_running_loop().create_task(self._forward(data, addr))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _forward(self, query: bytes, client: tuple[str | int, int]) -> None:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
            out.setblocking(False)
            try:
                await loop.sock_connect(out, (self.upstream.address, self.upstream.port))
                await loop.sock_sendall(out, query)
                answer = await asyncio.wait_for(loop.sock_recv(out, 65535), UPSTREAM_TIMEOUT_S)
            except (OSError, TimeoutError) as err:
                log.debug("dns relay: upstream %s failed: %s", self.upstream.address, err)
                return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(answer, client)


async def _tcp_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: Upstream) -> None:
    try:
        while True:
            header = await reader.readexactly(2)
            (length,) = struct.unpack("!H", header)
            query = await reader.readexactly(length)
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(upstream.address, upstream.port), UPSTREAM_TIMEOUT_S
            )
            try:
                up_writer.write(header + query)
                await up_writer.drain()
                (answer_len,) = struct.unpack(
                    "!H", await asyncio.wait_for(up_reader.readexactly(2), UPSTREAM_TIMEOUT_S)
                )
                answer = await asyncio.wait_for(up_reader.readexactly(answer_len), UPSTREAM_TIMEOUT_S)
            finally:
                up_writer.close()
            writer.write(struct.pack("!H", len(answer)) + answer)
            await writer.drain()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def dns_relay(netns: str, upstream: Upstream | None = None, *, address: str = GATEWAY_IP) -> AsyncIterator[None]:
    """Answer DNS on ``address``:53 inside ``netns`` by relaying to ``upstream`` (the host's first resolver)
    while the context is open. Without an upstream the guest gets no answers (its queries are refused)."""
    if upstream is None:
        servers = host_resolvers()
        if not servers:
            log.warning("dns relay: the host has no IPv4 name server; %s gets no DNS", netns)
            yield
            return
        upstream = Upstream(servers[0])
    udp, tcp = await asyncio.to_thread(_sockets_in_netns, netns, address, 53)
    loop = asyncio.get_running_loop()
    protocol = _UdpRelay(upstream)
    transport, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=udp)
    clients: set[asyncio.Task[None]] = set()

    def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = loop.create_task(_tcp_client(reader, writer, upstream))
        clients.add(task)
        task.add_done_callback(clients.discard)

    server = await asyncio.start_server(accept, sock=tcp)
    try:
        yield
    finally:
        server.close()
        transport.close()
        for task in [*protocol.pending, *clients]:  # every connection ends with the relay, its sockets closed
            task.cancel()
        await asyncio.gather(*protocol.pending, *clients, return_exceptions=True)
        with contextlib.suppress(Exception):
            await server.wait_closed()
        await protocol.closed.wait()  # gone when the context ends: a later query is refused, not queued


__all__ = ["Upstream", "dns_relay", "host_resolvers"]
