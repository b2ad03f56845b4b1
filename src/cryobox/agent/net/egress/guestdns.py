"""The guest's name server: answers on the slot's gateway address (the guest's ``nameserver 172.16.0.1``), per
the sandbox's policy, read at every query.

A name the policy does not let resolve (:func:`~cryobox.netpolicy.name_resolves`: a denied name, or any name
when nothing could be reached by one) is answered NXDOMAIN here and never asked upstream; every other query is
forwarded as it came to the upstream (:class:`.resolver.Resolver`) and its answer relayed. Denials are logged.
UDP and TCP (length-prefixed) queries are both served; a query that is not DNS is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from typing import cast

import dns.exception
import dns.message
import dns.rcode

from ....agentapi.models import EgressDecision
from ....errors import InvalidArgument
from ....netpolicy import EgressPolicy, name_resolves, normalize_name
from .decisions import DecisionLog, DecisionObserver
from .resolver import Resolver

log = logging.getLogger(__name__)
MAX_TCP_QUERY = 65535


class GuestDns:
    """Judges and answers one sandbox's queries; ``policy`` is called for the policy in force at each query."""

    def __init__(
        self,
        policy: Callable[[], EgressPolicy],
        resolver: Resolver,
        decisions: Callable[[], DecisionLog],
        observer: DecisionObserver,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._policy = policy
        self._resolver = resolver
        self._decisions = decisions
        self._observer = observer
        self._clock = clock

    async def answer(self, wire: bytes) -> bytes | None:
        """The reply to one query in wire format (``None``: not a query, dropped)."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        if not query.question:
            return None
        qname = query.question[0].name.to_text(omit_final_dot=True)
        try:
            name = normalize_name(qname, wildcard=False)
        except InvalidArgument:
            name = None
        if name is None or not name_resolves(self._policy(), name):
            self._deny(qname)
            reply = dns.message.make_response(query)
            reply.set_rcode(dns.rcode.NXDOMAIN)
            return reply.to_wire()
        try:
            answer = await self._resolver.exchange(query)
        except (dns.exception.DNSException, OSError) as err:
            log.debug("guest dns: upstream failed for %s: %s", qname, err)
            reply = dns.message.make_response(query)
            reply.set_rcode(dns.rcode.SERVFAIL)
            return reply.to_wire()
        return answer.to_wire()

    def _deny(self, qname: str) -> None:
        self._observer.on_decision(False, "dns")
        self._decisions().add(
            EgressDecision(time=self._clock(), name=qname[:253], ip=None, port=53, allowed=False, reason="dns")
        )


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, dns_: GuestDns) -> None:
        self.dns = dns_
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def datagram_received(self, data: bytes, addr: tuple[str | int, int]) -> None:
        task = asyncio.get_running_loop().create_task(self._reply(data, addr))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _reply(self, data: bytes, addr: tuple[str | int, int]) -> None:
        reply = await self.dns.answer(data)
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply, addr)


async def _tcp(dns_: GuestDns, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            reply = await dns_.answer(await reader.readexactly(length))
            if reply is None:
                return
            writer.write(struct.pack("!H", len(reply)) + reply)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


class DnsServer:
    """Serves ``dns_`` on already-bound sockets (UDP, and a listening TCP socket) until :meth:`close`."""

    def __init__(self, dns_: GuestDns) -> None:
        self.dns = dns_
        self._protocol = _Udp(dns_)
        self._transport: asyncio.DatagramTransport | None = None
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self, udp: object, tcp: object) -> None:
        import socket

        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self._protocol, sock=cast(socket.socket, udp))
        self._transport = transport

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = loop.create_task(_tcp(self.dns, reader, writer))
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)

        self._server = await asyncio.start_server(accept, sock=cast(socket.socket, tcp))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._transport is not None:
            self._transport.close()
        tasks = [*self._protocol.pending, *self._clients]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        if self._transport is not None:
            await self._protocol.closed.wait()


__all__ = ["DnsServer", "GuestDns"]
