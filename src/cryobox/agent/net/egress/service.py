"""The host's egress service: for each sandbox's slot, the proxy its guest's TCP is redirected to and the name
server its resolver asks, both on the slot's gateway address inside the slot's network namespace, both judging by
the sandbox's policy.

The listening sockets are made in the slot's namespace (a short-lived thread ``setns``-es there, binds and exits)
and served by the agent's event loop; the proxy's own connections out are made from the host's namespace. A
policy change (:meth:`EgressService.update`) is a reference swap: it holds for the next packet, and open
connections it denies are cut. Decision logs are per sandbox and outlive its slot (a hibernated sandbox keeps its
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

from ....agentapi.models import EgressLog
from ....netpolicy import EgressPolicy
from ....util.system import in_fresh_thread
from ....util.tcp import tcp_socket
from ..slots import GATEWAY_IP, NETNS_DIR, PROXY_PORT
from .decisions import DecisionLog
from .guestdns import DnsServer, GuestDns
from .metrics import EgressMetrics
from .proxy import ProxyEnv, SlotProxy

log = logging.getLogger(__name__)
CLONE_NEWNET = 0x40000000
DNS_PORT = 53


def _bind_in_netns(netns: str, address: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    """(proxy TCP, DNS UDP, DNS TCP), bound and listening inside ``netns``."""

    def make() -> tuple[socket.socket, socket.socket, socket.socket]:
        fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({netns}): {os.strerror(err)}")
        finally:
            os.close(fd)
        made: list[socket.socket] = []
        try:
            for kind, port in (
                (socket.SOCK_STREAM, PROXY_PORT),
                (socket.SOCK_DGRAM, DNS_PORT),
                (socket.SOCK_STREAM, DNS_PORT),
            ):
                sock = tcp_socket() if kind == socket.SOCK_STREAM else socket.socket(socket.AF_INET, kind)
                made.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                sock.setblocking(False)
                if kind == socket.SOCK_STREAM:
                    sock.listen(128)
        except BaseException:
            for sock in made:
                sock.close()
            raise
        return made[0], made[1], made[2]

    return in_fresh_thread(make, name="cryobox-egress-netns")


@dataclass(eq=False)
class _Attached:
    netns: str
    proxy: SlotProxy
    listener: socket.socket
    accepting: asyncio.Task[None]
    dns: DnsServer


class EgressService:
    """Attaches sandboxes' policies to their slots; one per host agent."""

    def __init__(self, env: ProxyEnv, metrics: EgressMetrics | None = None) -> None:
        self.env = env
        self.metrics = metrics
        self._attached: dict[str, _Attached] = {}
        self._policies: dict[str, EgressPolicy] = {}
        self._logs: dict[str, DecisionLog] = {}

    def log_of(self, sandbox_id: str) -> DecisionLog:
        return self._logs.setdefault(sandbox_id, DecisionLog())

    async def attach(self, sandbox_id: str, netns: str, policy: EgressPolicy) -> None:
        """Serve ``sandbox_id``'s guest in slot ``netns`` under ``policy`` (replacing whatever served it)."""
        await self.detach(sandbox_id)
        proxy_sock, udp, tcp = await asyncio.to_thread(_bind_in_netns, netns, GATEWAY_IP)
        proxy = SlotProxy(sandbox_id, policy, self.env, self.log_of(sandbox_id))
        dns = DnsServer(
            GuestDns(lambda: proxy.policy, self.env.resolver, lambda: self.log_of(sandbox_id), self.env.observer)
        )
        try:
            await dns.start(udp, tcp)
        except BaseException:
            for sock in (proxy_sock, udp, tcp):
                sock.close()
            raise
        accepting = asyncio.get_running_loop().create_task(proxy.serve(proxy_sock))
        self._policies[sandbox_id] = policy
        self._attached[sandbox_id] = _Attached(netns, proxy, proxy_sock, accepting, dns)

    def update(self, sandbox_id: str, policy: EgressPolicy) -> int:
        """Put ``policy`` in force for ``sandbox_id`` now; returns how many open connections it cut. A sandbox
        not attached (hibernated, paused in the store) gets it when it is attached next."""
        self._policies[sandbox_id] = policy
        attached = self._attached.get(sandbox_id)
        return attached.proxy.set_policy(policy) if attached is not None else 0

    def open_connections(self, sandbox_id: str) -> int:
        attached = self._attached.get(sandbox_id)
        return len(attached.proxy.flows) if attached is not None else 0

    def policy(self, sandbox_id: str) -> EgressPolicy | None:
        return self._policies.get(sandbox_id)

    def attached(self) -> Sequence[str]:
        return list(self._attached)

    async def detach(self, sandbox_id: str) -> None:
        """Stop serving ``sandbox_id``'s slot (its listeners close, its connections end). Idempotent."""
        attached = self._attached.pop(sandbox_id, None)
        if attached is None:
            return
        attached.accepting.cancel()
        await asyncio.gather(attached.accepting, return_exceptions=True)
        attached.listener.close()
        await attached.proxy.close()
        await attached.dns.close()

    async def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: detach it and drop its log and policy."""
        await self.detach(sandbox_id)
        self._policies.pop(sandbox_id, None)
        self._logs.pop(sandbox_id, None)

    def read_log(self, sandbox_id: str, limit: int | None = None) -> EgressLog:
        return self.log_of(sandbox_id).read(limit) if sandbox_id in self._logs else EgressLog(items=[], dropped=0)

    async def close(self) -> None:
        for sandbox_id in list(self._attached):
            await self.detach(sandbox_id)


__all__ = ["DNS_PORT", "PROXY_PORT", "EgressService"]
