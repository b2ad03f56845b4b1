"""The host's egress service: for each sandbox's slot, what decides its guest's TCP — the egress gate its
connections are queued to (``forward`` mode, :mod:`.gate`) or the proxy they are redirected to (``proxy`` mode,
:mod:`.proxy`) — and the name server its resolver asks, on the slot's gateway address; all judge by the sandbox's
policy.

The sockets are made in the slot's namespace (a short-lived thread ``setns``-es there, binds and exits) and served
by the agent's event loop; the proxy's own connections out are made from the host's namespace. A policy change
(:meth:`EgressService.update`) is a reference swap: it holds for the next connection, and open connections it
denies are cut. Decision logs are per sandbox and outlive its slot (a hibernated sandbox keeps its
log until it is deleted, :meth:`EgressService.forget`); they are kept in memory only.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ....agentapi.models import EgressLog
from ....netpolicy import EgressPolicy
from ....util.system import in_fresh_thread
from ....util.tcp import tcp_socket
from ..slots import GATEWAY_IP, NETNS_DIR, PROXY_PORT, EgressMode
from .conntrack import Conntrack
from .decisions import DecisionLog
from .gate import Gate
from .guestdns import DnsServer, GuestDns
from .metrics import EgressMetrics
from .nfqueue import NfQueue
from .proxy import ProxyEnv, SlotProxy

log = logging.getLogger(__name__)
CLONE_NEWNET = 0x40000000
DNS_PORT = 53
CONNTRACK_ACCT = Path("/proc/sys/net/netfilter/nf_conntrack_acct")


@dataclass(eq=False)
class _Bound:
    """What a slot's namespace gave: the name server's sockets, and the proxy's listener or the gate's queue."""

    udp: socket.socket
    tcp: socket.socket
    listener: socket.socket | None = None
    queue: NfQueue | None = None
    tracker: Conntrack | None = None

    def close(self) -> None:
        for sock in (self.udp, self.tcp, self.listener):
            if sock is not None:
                sock.close()
        if self.queue is not None:
            self.queue.close()
        if self.tracker is not None:
            self.tracker.close()


def _bind_in_netns(netns: str, address: str, mode: EgressMode) -> _Bound:
    """The slot's sockets, bound (and listening) inside ``netns``."""

    def make() -> _Bound:
        fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({netns}): {os.strerror(err)}")
        finally:
            os.close(fd)
        made: list[socket.socket] = []
        bound: _Bound | None = None
        try:
            ports = [(socket.SOCK_DGRAM, DNS_PORT), (socket.SOCK_STREAM, DNS_PORT)]
            for kind, port in ports + ([(socket.SOCK_STREAM, PROXY_PORT)] if mode == "proxy" else []):
                sock = tcp_socket() if kind == socket.SOCK_STREAM else socket.socket(socket.AF_INET, kind)
                made.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                sock.setblocking(False)
                if kind == socket.SOCK_STREAM:
                    sock.listen(128)
            bound = _Bound(made[0], made[1], made[2] if mode == "proxy" else None)
            if mode == "forward":
                CONNTRACK_ACCT.write_text("1")  # this namespace's: byte counts for the decision log
                bound.tracker = Conntrack.open(events=True)
                bound.queue = NfQueue.open(0)
        except BaseException:
            if bound is not None:
                bound.close()
            else:
                for sock in made:
                    sock.close()
            raise
        return bound

    return in_fresh_thread(make, name="cryobox-egress-netns")


class _Enforcer(Protocol):
    policy: EgressPolicy

    def set_policy(self, policy: EgressPolicy) -> int: ...

    def open_connections(self) -> int: ...


@dataclass(eq=False)
class _Attached:
    netns: str
    enforcer: _Enforcer
    bound: _Bound
    dns: DnsServer
    accepting: asyncio.Task[None] | None = None
    gate: Gate | None = None
    proxy: SlotProxy | None = None

    async def close(self, *, end_connections: bool) -> None:
        """Stop serving; ``end_connections``: also forget the guest's connections the kernel forwards (the sandbox
        leaves its slot), else they go on (the agent stops; its successor adopts them)."""
        if self.accepting is not None:
            self.accepting.cancel()
            await asyncio.gather(self.accepting, return_exceptions=True)
        if self.proxy is not None:
            await self.proxy.close()
        if self.gate is not None:
            await self.gate.close()
        if self.gate is not None and self.bound.tracker is not None and end_connections:
            for key in self.gate.known():  # what it let out (or denied): nothing of it outlives the sandbox here
                self.bound.tracker.delete(key)
        await self.dns.close()
        self.bound.close()


class EgressService:
    """Attaches sandboxes' policies to their slots; one per host agent."""

    def __init__(self, env: ProxyEnv, metrics: EgressMetrics | None = None, *, mode: EgressMode = "forward") -> None:
        self.env = env
        self.metrics = metrics
        self.mode = mode
        self._attached: dict[str, _Attached] = {}
        self._policies: dict[str, EgressPolicy] = {}
        self._logs: dict[str, DecisionLog] = {}

    def log_of(self, sandbox_id: str) -> DecisionLog:
        return self._logs.setdefault(sandbox_id, DecisionLog())

    async def attach(self, sandbox_id: str, netns: str, policy: EgressPolicy, *, adopt: bool = False) -> None:
        """Serve ``sandbox_id``'s guest in slot ``netns`` under ``policy`` (replacing whatever served it).
        ``adopt``: the guest ran under an earlier agent; its connections the kernel still forwards are taken on
        (a conntrack dump: it walks the host's whole table, ~10 ms here, so only then)."""
        await self.detach(sandbox_id)
        bound = await asyncio.to_thread(_bind_in_netns, netns, GATEWAY_IP, self.mode)
        decisions = self.log_of(sandbox_id)
        if bound.queue is not None and bound.tracker is not None:
            gate = Gate(sandbox_id, policy, self.env, decisions, bound.queue, bound.tracker)
            attached = _Attached(netns, gate, bound, self._dns(sandbox_id, gate), gate=gate)
        else:
            assert bound.listener is not None
            proxy = SlotProxy(sandbox_id, policy, self.env, decisions)
            attached = _Attached(netns, proxy, bound, self._dns(sandbox_id, proxy), proxy=proxy)
        try:
            await attached.dns.start(bound.udp, bound.tcp)
            if attached.gate is not None:
                attached.gate.start(adopt=adopt)
        except BaseException:
            await attached.close(end_connections=False)  # idempotent: whatever of it started stops
            raise
        if attached.proxy is not None and bound.listener is not None:
            attached.accepting = asyncio.get_running_loop().create_task(attached.proxy.serve(bound.listener))
        self._policies[sandbox_id] = policy
        self._attached[sandbox_id] = attached

    def _dns(self, sandbox_id: str, enforcer: _Enforcer) -> DnsServer:
        return DnsServer(
            GuestDns(lambda: enforcer.policy, self.env.resolver, lambda: self.log_of(sandbox_id), self.env.observer)
        )

    def update(self, sandbox_id: str, policy: EgressPolicy) -> int:
        """Put ``policy`` in force for ``sandbox_id`` now; returns how many open connections it cut. A sandbox
        not attached (hibernated, paused in the store) gets it when it is attached next."""
        self._policies[sandbox_id] = policy
        attached = self._attached.get(sandbox_id)
        return attached.enforcer.set_policy(policy) if attached is not None else 0

    def open_connections(self, sandbox_id: str) -> int:
        attached = self._attached.get(sandbox_id)
        return attached.enforcer.open_connections() if attached is not None else 0

    def policy(self, sandbox_id: str) -> EgressPolicy | None:
        return self._policies.get(sandbox_id)

    def attached(self) -> Sequence[str]:
        return list(self._attached)

    async def detach(self, sandbox_id: str) -> None:
        """Stop serving ``sandbox_id``'s slot (its listeners close, its connections end). Idempotent."""
        attached = self._attached.pop(sandbox_id, None)
        if attached is not None:
            await attached.close(end_connections=True)

    async def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: detach it and drop its log and policy."""
        await self.detach(sandbox_id)
        self._policies.pop(sandbox_id, None)
        self._logs.pop(sandbox_id, None)

    def read_log(self, sandbox_id: str, limit: int | None = None) -> EgressLog:
        return self.log_of(sandbox_id).read(limit) if sandbox_id in self._logs else EgressLog(items=[], dropped=0)

    async def close(self) -> None:
        """The agent stops: nothing is served any more, but the connections the kernel forwards for the guests
        go on (with their VMs, if they are kept), for the next agent to adopt."""
        while self._attached:
            _, attached = self._attached.popitem()
            await attached.close(end_connections=False)


__all__ = ["DNS_PORT", "PROXY_PORT", "EgressService"]
