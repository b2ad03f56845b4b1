"""One sandbox's egress proxy: every TCP connection the guest opens is redirected here (the slot's nft
``redirect``), judged, and — if allowed — carried on by a connection the *host* opens.

For each connection: the address the guest asked for (``SO_ORIGINAL_DST``); when the policy has name rules, the
name it carries (TLS SNI or HTTP ``Host``, read from its first bytes, at most :data:`FIRST_BYTES_S` of waiting —
a protocol where the server speaks first is judged by address after that); then the verdict
(:func:`~cryobox.netpolicy.decide`). A connection with a name goes to an address the proxy resolved for that name,
never to the one the guest chose, so claiming an allowed name cannot reach a denied address and many names sharing
one address are told apart. A connection without one is judged by its address alone.

The policy is read when a connection arrives; :meth:`SlotProxy.set_policy` re-judges the connections already
open and cuts (resets) those the new policy denies, so a narrowed policy holds at once for everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ....agentapi.models import EgressDecision
from ....netpolicy import EgressPolicy, Verdict, decide
from .decisions import DecisionLog, DecisionObserver
from .resolver import Resolver
from .sniff import MAX_SNIFF, original_dst, sniff

log = logging.getLogger(__name__)
FIRST_BYTES_S = 0.5
CONNECT_TIMEOUT_S = 10.0
MAX_OPEN = 512
"""Connections one sandbox may have open through the proxy at a time."""
CHUNK = 256 * 1024

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ProxyEnv:
    """What every sandbox's proxy shares on one host."""

    resolver: Resolver
    floor: Sequence[Network]
    observer: DecisionObserver
    clock: Callable[[], float] = time.time
    first_bytes_s: float = FIRST_BYTES_S
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    max_open: int = MAX_OPEN


@dataclass(eq=False)
class Flow:
    name: str | None
    ip: ipaddress.IPv4Address
    port: int
    started: float
    reason: str
    sent: int = 0
    received: int = 0
    transports: list[asyncio.WriteTransport] = field(default_factory=list)
    cut: bool = False


def _hard_abort(transport: asyncio.WriteTransport) -> None:
    """Close with a TCP RST (SO_LINGER 0): the peer sees the connection reset, never a clean end — a plain close
    would send what is still buffered and then a FIN, which a cut download could take for a complete one."""
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Refuse the guest's connection with a reset: it sees the connection refused, not a clean end."""
    _hard_abort(writer.transport)


class SlotProxy:
    """The proxy state of one sandbox: the policy in force, its open flows and its decision log."""

    def __init__(self, sandbox_id: str, policy: EgressPolicy, env: ProxyEnv, decisions: DecisionLog) -> None:
        self.sandbox_id = sandbox_id
        self.policy = policy
        self.env = env
        self.decisions = decisions
        self.flows: set[Flow] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def set_policy(self, policy: EgressPolicy) -> int:
        """Put ``policy`` in force for new connections and cut open ones it denies; returns how many were cut."""
        self.policy = policy
        cut = 0
        for flow in list(self.flows):
            if not decide(policy, name=flow.name, ip=flow.ip, port=flow.port, floor=self.env.floor).allowed:
                flow.cut = True
                for transport in flow.transports:
                    _hard_abort(transport)
                cut += 1
        return cut

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """End every connection (their tasks are cancelled and awaited)."""
        for flow in self.flows:
            for transport in flow.transports:
                transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except Exception:  # one guest connection must never take the proxy down
            log.exception("egress proxy: connection of %s failed", self.sandbox_id)
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started = self.env.clock()
        try:
            asked_ip, port = original_dst(writer.get_extra_info("socket"))
        except OSError:
            writer.transport.abort()
            return
        asked = ipaddress.IPv4Address(asked_ip)
        policy = self.policy
        if len(self.flows) >= self.env.max_open:
            self._record(started, None, asked, port, Verdict(False, "limit"))
            _reset(writer)
            return
        head, name = (await self._read_name(reader)) if policy.has_names else (b"", None)
        policy = self.policy  # the one in force once the name is known
        target, verdict = await self._judge(policy, name, asked, port)
        if not verdict.allowed:
            self._record(started, name, target, port, verdict)
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(target), port, limit=CHUNK), self.env.connect_timeout_s
            )
        except (OSError, TimeoutError):
            self._record(started, name, target, port, Verdict(True, verdict.reason), error="unreachable")
            _reset(writer)
            return
        flow = Flow(name, target, port, started, verdict.reason, transports=[writer.transport, up_writer.transport])
        self.flows.add(flow)
        try:
            if head:
                up_writer.write(head)
                flow.sent += len(head)
            await asyncio.gather(
                self._pipe(reader, up_writer, flow, outbound=True),
                self._pipe(up_reader, writer, flow, outbound=False),
            )
        finally:
            self.flows.discard(flow)
            for transport in flow.transports:
                _hard_abort(transport) if flow.cut else transport.close()
            self._record(
                started, name, target, port, Verdict(True, verdict.reason), flow, error="cut" if flow.cut else None
            )

    async def _read_name(self, reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
        head = b""
        deadline = asyncio.get_running_loop().time() + self.env.first_bytes_s
        while len(head) < MAX_SNIFF:
            found = sniff(head)
            if found.state != "more":
                return head, found.name
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(reader.read(MAX_SNIFF - len(head)), left)
            except TimeoutError:
                break
            if not chunk:
                break
            head += chunk
        return head, None

    async def _judge(
        self, policy: EgressPolicy, name: str | None, asked: ipaddress.IPv4Address, port: int
    ) -> tuple[ipaddress.IPv4Address, Verdict]:
        if name is None:
            return asked, decide(policy, name=None, ip=asked, port=port, floor=self.env.floor)
        addresses = await self.env.resolver.addresses(name)
        if not addresses:
            return asked, Verdict(False, "unresolved")
        verdicts = [(a, decide(policy, name=name, ip=a, port=port, floor=self.env.floor)) for a in addresses]
        for address, verdict in verdicts:
            if verdict.allowed:
                return address, verdict
        return verdicts[0]

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, flow: Flow, *, outbound: bool
    ) -> None:
        try:
            while chunk := await source.read(CHUNK):
                sink.write(chunk)
                if outbound:
                    flow.sent += len(chunk)
                else:
                    flow.received += len(chunk)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
        except (OSError, RuntimeError):  # reset by either end, or written after a cut
            for transport in flow.transports:
                transport.abort()

    def _record(
        self,
        started: float,
        name: str | None,
        ip: ipaddress.IPv4Address,
        port: int,
        verdict: Verdict,
        flow: Flow | None = None,
        error: str | None = None,
    ) -> None:
        sent, received = (flow.sent, flow.received) if flow is not None else (0, 0)
        self.env.observer.on_decision(verdict.allowed, verdict.reason)
        if flow is not None:
            self.env.observer.on_bytes(sent, received)
        self.decisions.add(
            EgressDecision(
                time=started,
                name=name,
                ip=str(ip),
                port=port,
                allowed=verdict.allowed,
                reason=verdict.reason,
                bytes_out=sent,
                bytes_in=received,
                error=error,
            )
        )


__all__ = ["CHUNK", "FIRST_BYTES_S", "MAX_OPEN", "ProxyEnv", "SlotProxy"]
