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
from dataclasses import dataclass

from ....agentapi.models import EgressDecision
from ....netpolicy import EgressPolicy, Verdict, decide
from ....util.tcp import tcp_socket
from .decisions import DecisionLog, DecisionObserver
from .relay import pump
from .resolver import Resolver
from .sniff import MAX_SNIFF, original_dst, sniff

log = logging.getLogger(__name__)
FIRST_BYTES_S = 0.5
CONNECT_TIMEOUT_S = 10.0
MAX_OPEN = 512
"""Connections one sandbox may have open through the proxy at a time."""

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
    pumping: asyncio.Future[tuple[None, None]] | None = None
    cut: bool = False

    def add_sent(self, n: int) -> None:
        self.sent += n

    def add_received(self, n: int) -> None:
        self.received += n


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0): the peer sees the connection reset, never a clean end (a plain close
    would send what is still buffered and a FIN, which a cut download could take for a complete one)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class SlotProxy:
    """The proxy state of one sandbox: the policy in force, its open flows and its decision log."""

    def __init__(self, sandbox_id: str, policy: EgressPolicy, env: ProxyEnv, decisions: DecisionLog) -> None:
        self.sandbox_id = sandbox_id
        self.policy = policy
        self.env = env
        self.decisions = decisions
        self.flows: set[Flow] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def open_connections(self) -> int:
        return len(self.flows)

    def set_policy(self, policy: EgressPolicy) -> int:
        """Put ``policy`` in force for new connections and cut open ones it denies; returns how many were cut."""
        self.policy = policy
        cut = 0
        for flow in list(self.flows):
            if not decide(policy, name=flow.name, ip=flow.ip, port=flow.port, floor=self.env.floor).allowed:
                flow.cut = True
                if flow.pumping is not None:
                    flow.pumping.cancel()
                cut += 1
        return cut

    async def serve(self, listener: socket.socket) -> None:
        """Accept the guest's (redirected) connections on ``listener`` until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            task = loop.create_task(self._handle(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """End every connection (their tasks are cancelled and awaited)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, conn: socket.socket) -> None:
        try:
            await self._serve(conn)
        except Exception:  # one guest connection must never take the proxy down
            log.exception("egress proxy: connection of %s failed", self.sandbox_id)
            _reset(conn)
        except BaseException:
            _reset(conn)
            raise

    async def _serve(self, conn: socket.socket) -> None:
        started = self.env.clock()
        try:
            asked_ip, port = original_dst(conn)
        except OSError:
            _reset(conn)
            return
        asked = ipaddress.IPv4Address(asked_ip)
        policy = self.policy
        if len(self.flows) >= self.env.max_open:
            self._record(started, None, asked, port, Verdict(False, "limit"))
            _reset(conn)
            return
        head, name = (await self._read_name(conn)) if policy.has_names else (b"", None)
        policy = self.policy  # the one in force once the name is known
        target, verdict = await self._judge(policy, name, asked, port)
        if not verdict.allowed:
            self._record(started, name, target, port, verdict)
            _reset(conn)
            return
        up = await self._connect(target, port)
        if up is None:
            self._record(started, name, target, port, verdict, error="unreachable")
            _reset(conn)
            return
        flow = Flow(name, target, port, started, verdict.reason)
        self.flows.add(flow)
        failed = False
        try:
            if head:
                await asyncio.get_running_loop().sock_sendall(up, head)
                flow.add_sent(len(head))
            pumping = flow.pumping = asyncio.gather(pump(conn, up, flow.add_sent), pump(up, conn, flow.add_received))
            await pumping
        except asyncio.CancelledError:
            if not flow.cut:  # the proxy is closing: the guest's connection ends with it
                failed = True
                raise
        except OSError:  # reset by either end: the other direction ends too
            failed = True
        finally:
            self.flows.discard(flow)
            if flow.pumping is not None and not flow.pumping.done():
                flow.pumping.cancel()
                await asyncio.gather(flow.pumping, return_exceptions=True)
            for sock in (up, conn):
                _reset(sock) if flow.cut or failed else sock.close()
            self._record(started, name, target, port, verdict, flow, error="cut" if flow.cut else None)

    async def _connect(self, target: ipaddress.IPv4Address, port: int) -> socket.socket | None:
        up = tcp_socket()  # no Nagle: a pump forwards what it has at once (the guest's side: the listener's)
        up.setblocking(False)
        try:
            connecting = asyncio.get_running_loop().sock_connect(up, (str(target), port))
            await asyncio.wait_for(connecting, self.env.connect_timeout_s)
        except (OSError, TimeoutError):
            up.close()
            return None
        return up

    async def _read_name(self, conn: socket.socket) -> tuple[bytes, str | None]:
        loop = asyncio.get_running_loop()
        head = b""
        deadline = loop.time() + self.env.first_bytes_s
        while len(head) < MAX_SNIFF:
            found = sniff(head)
            if found.state != "more":
                return head, found.name
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(conn, MAX_SNIFF - len(head)), left)
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


__all__ = ["FIRST_BYTES_S", "MAX_OPEN", "ProxyEnv", "SlotProxy"]
