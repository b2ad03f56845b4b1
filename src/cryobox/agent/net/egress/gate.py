"""One sandbox's egress gate: its guest's TCP connections are *forwarded by the kernel*, and this decides each one.

The slot queues every packet the guest sends on a connection nothing has decided yet (``NFQUEUE``, see
:func:`..netlink.slot_ruleset`); the gate answers each with a verdict that marks it, and the slot's rules copy a
decision's mark to the connection (``ct mark``), so a decided connection's packets never come here again: after
its first bytes, a connection costs what direct forwarding costs. A connection:

* **opens** (SYN): judged by its address. The floor, ports and deny networks refuse it at once, and without name
  rules the address decides everything. With name rules it may go on, undecided, when its address is allowed or
  when an allowed name resolved to it on this host (:meth:`.resolver.Resolver.names_of`): no packet reaches an
  address nothing in the policy could allow, not even a SYN.
* **carries its first bytes**: held (not forwarded) until they name a host (TLS SNI or HTTP ``Host``,
  :func:`.sniff.sniff`) or :attr:`ProxyEnv.first_bytes_s` after it opened, then judged by name. A name rule holds
  only for an address that name resolves to here: claiming an allowed name does not reach another address. A
  connection without a name (or past the wait) is judged by its address alone.
* **is decided**: allowed, its held packets go out and the kernel forwards the rest; denied, they are rejected and
  the guest's connection is reset. Decided connections are logged when they end (conntrack's byte counts, IP
  bytes each way).

A policy change holds for the next decision at once, and connections already allowed are re-judged: those it
denies get the deny mark, and the next packet either end sends on them resets the guest's connection (the
server's is turned into a reset for the guest; the guest's is answered with one). Connections a previous agent
process allowed outlive it (the kernel forwards them, the gate adopts them from conntrack); their names are lost,
so a change to a policy with name rules cuts them, and one without is judged by their address.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Literal

from ....agentapi.models import EgressDecision
from ....netpolicy import EgressPolicy, Verdict, decide
from ....netpolicy.names import matches_name
from ..slots import GUEST_IP, MARK_ALLOW, MARK_DENY, MARK_PASS
from .conntrack import CtEvent, FlowKey
from .decisions import DecisionLog
from .gateflow import ENDED_STATES, MAX_DENIED, STALE_S, Flow, Queue, Tracker
from .nfqueue import NF_ACCEPT, NF_DROP, NF_REPEAT, QueuedPacket
from .packet import TcpPacket, parse_tcp, reset_of
from .proxy import ProxyEnv
from .sniff import MAX_SNIFF, sniff

log = logging.getLogger(__name__)


class Gate:
    """The decisions of one slot's queue; ``start`` hooks it to the running loop, ``close`` unhooks it."""

    def __init__(
        self,
        sandbox_id: str,
        policy: EgressPolicy,
        env: ProxyEnv,
        decisions: DecisionLog,
        queue: Queue,
        tracker: Tracker,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.policy = policy
        self.env = env
        self.decisions = decisions
        self.queue = queue
        self.tracker = tracker
        self._monotonic = monotonic
        self.flows: dict[FlowKey, Flow] = {}
        self._denied: collections.OrderedDict[FlowKey, None] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- wiring ----------------------------------------------------------------------------------------------------

    def start(self, *, adopt: bool = False) -> None:
        """Serve the queue and the tracker's events; ``adopt``: first take on the connections an earlier process
        allowed (the slot's guest ran under another agent)."""
        for entry in self.tracker.dump() if adopt else ():
            if entry.mark == MARK_ALLOW and entry.tcp_state not in ENDED_STATES and entry.key not in self.flows:
                self.flows[entry.key] = self._flow(entry.key, state="allowed", inherited=True, reason="inherited")
        loop = self._loop = asyncio.get_running_loop()
        loop.add_reader(self.queue.fileno(), self._on_queue)
        loop.add_reader(self.tracker.event_fileno(), self._on_events)

    async def close(self) -> None:
        """Stop serving (idempotent); the caller closes the queue and tracker."""
        if self._loop is not None:
            self._loop.remove_reader(self.queue.fileno())
            self._loop.remove_reader(self.tracker.event_fileno())
            self._loop = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for flow in self.flows.values():
            if flow.timer is not None:
                flow.timer.cancel()

    def known(self) -> list[FlowKey]:
        """The connections it let out or is deciding, and those it denied lately."""
        return [*self.flows, *self._denied]

    def open_connections(self) -> int:
        return sum(1 for flow in self.flows.values() if flow.state == "allowed")

    def set_policy(self, policy: EgressPolicy) -> int:
        """Put ``policy`` in force for the next decision; cut allowed connections it denies (returns how many)."""
        self.policy = policy
        cut = 0
        for flow in list(self.flows.values()):
            if flow.state != "allowed":
                continue
            # a connection an earlier process allowed lost its name: re-judged by address when names play no part
            unknown = flow.inherited and policy.has_names
            if unknown or not self._decide(flow.judged_as, flow.ip, flow.port).allowed:
                self.tracker.set_mark(flow.key, MARK_DENY)
                self._finish(flow, error="cut")
                self._remember_denied(flow.key)
                cut += 1
        return cut

    # -- packets ---------------------------------------------------------------------------------------------------

    def _on_queue(self) -> None:
        try:
            packets = self.queue.read()
        except OSError:
            log.exception("egress gate of %s: queue read failed", self.sandbox_id)
            return
        for queued in packets:
            try:
                self.handle(queued)
            except Exception:  # one packet must never take the gate down: it is dropped, TCP sends it again
                log.exception("egress gate of %s: packet failed", self.sandbox_id)
                self.queue.verdict(queued.id, NF_DROP)

    def handle(self, queued: QueuedPacket) -> None:
        """Answer (or hold) one queued packet."""
        tcp = parse_tcp(queued.packet)
        if tcp is None:
            self.queue.verdict(queued.id, NF_DROP)
            return
        if tcp.dst == GUEST_IP and tcp.src != GUEST_IP:
            self._reply(FlowKey(tcp.dst, tcp.dport, tcp.src, tcp.sport), tcp, queued)
            return
        key = FlowKey(tcp.src, tcp.sport, tcp.dst, tcp.dport)
        flow = self.flows.get(key)
        if flow is None and key in self._denied:  # queued before its connection got the deny mark
            self._verdict(queued.id, MARK_DENY)
            return
        if flow is None:
            self._first_packet(key, tcp, queued.id)
            return
        if flow.state == "allowed":  # queued before its connection got the mark
            self._verdict(queued.id, MARK_ALLOW)
            return
        if flow.judging:
            flow.held.append(queued.id)
            return
        if tcp.opens:  # the SYN again: still undecided
            self._verdict(queued.id, MARK_PASS)
            return
        if not tcp.payload:
            if self._monotonic() - flow.opened >= self.env.first_bytes_s and not flow.head:
                flow.held.append(queued.id)
                self._judge(flow, None)
            else:
                self._verdict(queued.id, MARK_PASS)
            return
        if flow.next_seq is not None and tcp.seq != flow.next_seq:  # a retransmission of held bytes, or a gap
            self.queue.verdict(queued.id, NF_DROP)
            return
        flow.head += tcp.payload
        flow.next_seq = (tcp.seq + len(tcp.payload)) & 0xFFFFFFFF
        flow.held.append(queued.id)
        found = sniff(bytes(flow.head[:MAX_SNIFF]))
        left = flow.opened + self.env.first_bytes_s - self._monotonic()
        if found.state != "more" or left <= 0:
            self._judge(flow, found.name)

    def _reply(self, key: FlowKey, tcp: TcpPacket, queued: QueuedPacket) -> None:
        """A packet from the server of a connection nothing decided: the handshake passes; what it says before the
        decision waits for it (a protocol where the server speaks first is judged by address when the wait ends)."""
        flow = self.flows.get(key)
        if flow is None:  # denied (or cut): the guest learns at once; unknown here: dropped
            reset = reset_of(queued.packet) if key in self._denied else None
            if reset is not None:
                self.queue.verdict(queued.id, NF_ACCEPT, mark=MARK_PASS, packet=reset)
            else:
                self.queue.verdict(queued.id, NF_DROP)
        elif flow.state == "allowed":
            self._verdict(queued.id, MARK_ALLOW)
        elif not tcp.payload and not flow.replies:
            self._verdict(queued.id, MARK_PASS)
        else:
            flow.replies.append((queued.id, queued.packet))

    def _first_packet(self, key: FlowKey, tcp: TcpPacket, packet_id: int) -> None:
        ip = ipaddress.IPv4Address(tcp.dst)
        if len(self.flows) >= self.env.max_open:
            self._deny_now(packet_id, ip, tcp.dport, Verdict(False, "limit"))
            return
        verdict = self._decide(None, ip, tcp.dport)
        if not tcp.opens or not self.policy.has_names or verdict.reason in ("floor", "port", "deny-cidr"):
            # no name can change it (or a packet of a connection opened before this gate: no first bytes to read)
            if not verdict.allowed:
                self._deny_now(packet_id, ip, tcp.dport, verdict)
                return
            self.flows[key] = self._flow(key, state="allowed", reason=verdict.reason)
            self._verdict(packet_id, MARK_ALLOW)
            return
        flow = self.flows[key] = self._flow(key)
        flow.next_seq = (tcp.seq + 1) & 0xFFFFFFFF
        flow.timer = asyncio.get_running_loop().call_later(self.env.first_bytes_s, self._judge, flow, None)
        if verdict.allowed:
            self._verdict(packet_id, MARK_PASS)
            return
        flow.held.append(packet_id)  # only an allowed name's address may open it
        self._spawn(self._open_by_name(flow, verdict))

    # -- decisions -------------------------------------------------------------------------------------------------

    def _decide(self, name: str | None, ip: ipaddress.IPv4Address, port: int) -> Verdict:
        return decide(self.policy, name=name, ip=ip, port=port, floor=self.env.floor)

    async def _open_by_name(self, flow: Flow, verdict: Verdict) -> None:
        flow.judging = True
        try:
            ok = await self._named_address(flow.ip)
        except Exception:
            log.exception("egress gate of %s: resolving for %s failed", self.sandbox_id, flow.ip)
            ok = False
        finally:
            flow.judging = False
        if not ok:
            self._settle(flow, None, verdict)
            return
        held, flow.held = flow.held, []
        for packet_id in held:
            self._verdict(packet_id, MARK_PASS)

    async def _named_address(self, ip: ipaddress.IPv4Address) -> bool:
        """Whether a name this policy allows resolves to ``ip`` (pinned here, or an exact name's lookup)."""
        policy = self.policy
        if any(self._name_allowed(policy, name) for name in self.env.resolver.names_of(ip)):
            return True
        exact = [name for name in policy.allow_names if not name.startswith("*.")]
        found = await asyncio.gather(*(self.env.resolver.addresses(name) for name in exact))
        return any(ip in addresses for addresses in found)

    @staticmethod
    def _name_allowed(policy: EgressPolicy, name: str) -> bool:
        return not any(matches_name(p, name) for p in policy.deny_names) and any(
            matches_name(p, name) for p in policy.allow_names
        )

    def _judge(self, flow: Flow, name: str | None) -> None:
        if flow.timer is not None:
            flow.timer.cancel()
            flow.timer = None
        if flow.judging or flow.state != "pending" or self.flows.get(flow.key) is not flow:
            return
        flow.judging = True
        self._spawn(self._judge_by_name(flow, name))

    async def _judge_by_name(self, flow: Flow, name: str | None) -> None:
        try:
            verdict = await self._by_name(flow, name)
        except Exception:
            log.exception("egress gate of %s: judging %s failed", self.sandbox_id, name)
            verdict = Verdict(False, "error")
        finally:
            flow.judging = False
        flow.judged_as = name if verdict.reason == "allow-name" else None
        self._settle(flow, name, verdict)

    async def _by_name(self, flow: Flow, name: str | None) -> Verdict:
        verdict = self._decide(name, flow.ip, flow.port)
        if name is None or verdict.reason != "allow-name":
            return verdict
        # the name allows it: only at an address it resolves to here (a denied name is never looked up)
        resolves = name in self.env.resolver.names_of(flow.ip)
        resolves = resolves or flow.ip in await self.env.resolver.addresses(name)
        verdict = self._decide(name, flow.ip, flow.port)  # the policy in force now
        if verdict.reason != "allow-name" or resolves:
            return verdict
        by_address = self._decide(None, flow.ip, flow.port)
        return by_address if by_address.allowed else Verdict(False, "mismatch")

    def _settle(self, flow: Flow, name: str | None, verdict: Verdict) -> None:
        flow.name, flow.reason = name, verdict.reason
        if flow.timer is not None:
            flow.timer.cancel()
            flow.timer = None
        held, flow.held = flow.held, []
        replies, flow.replies = flow.replies, []
        if verdict.allowed:  # in the order they came (ids grow): a server's bytes before the guest's reply to them
            for packet_id in sorted([*held, *(packet_id for packet_id, _ in replies)]):
                self._verdict(packet_id, MARK_ALLOW)
        else:
            for packet_id in held:
                self._verdict(packet_id, MARK_DENY)
            for n, (packet_id, packet) in enumerate(replies):
                if n == 0 and (reset := reset_of(packet)) is not None:  # the guest learns at once: reset
                    self.queue.verdict(packet_id, NF_ACCEPT, mark=MARK_PASS, packet=reset)
                else:
                    self.queue.verdict(packet_id, NF_DROP)
        if verdict.allowed:
            flow.state = "allowed"
            flow.head = bytearray()
        else:
            self.flows.pop(flow.key, None)
            self._remember_denied(flow.key)
            self._record(flow, verdict.allowed, verdict.reason)

    def _remember_denied(self, key: FlowKey) -> None:
        self._denied[key] = None
        while len(self._denied) > MAX_DENIED:
            self._denied.popitem(last=False)

    def _deny_now(self, packet_id: int, ip: ipaddress.IPv4Address, port: int, verdict: Verdict) -> None:
        self._verdict(packet_id, MARK_DENY)
        self._record(self._flow(FlowKey("", 0, str(ip), port)), False, verdict.reason)

    def _verdict(self, packet_id: int, mark: int) -> None:
        self.queue.verdict(packet_id, NF_REPEAT, mark=mark)

    # -- ends ------------------------------------------------------------------------------------------------------

    def _on_events(self) -> None:
        try:
            events = self.tracker.read_events()
        except OSError:
            log.exception("egress gate of %s: conntrack events failed", self.sandbox_id)
            return
        self.handle_events(events)

    def handle_events(self, events: list[CtEvent]) -> None:
        """Log the connections these conntrack events say have ended."""
        for event in events:
            flow = self.flows.get(event.key)
            if flow is None or not (event.destroyed or event.tcp_state in ENDED_STATES):
                continue
            if flow.state == "pending":  # ended before its first bytes: judged by address, for the log
                flow.reason = self._decide(None, flow.ip, flow.port).reason
            counted = event.bytes_orig is not None and event.bytes_reply is not None
            self._finish(flow, sizes=(event.bytes_orig or 0, event.bytes_reply or 0) if counted else None)
        self._forget_stale()

    def _finish(self, flow: Flow, *, sizes: tuple[int, int] | None = None, error: str | None = None) -> None:
        self.flows.pop(flow.key, None)
        if flow.timer is not None:
            flow.timer.cancel()
        if sizes is None:
            try:
                sizes = self.tracker.counters(flow.key)
            except OSError:  # no counters (accounting was off as it began), or conntrack did not answer
                log.warning("egress gate of %s: no byte counts for %s", self.sandbox_id, flow.key, exc_info=True)
        sent, received = sizes if sizes is not None else (0, 0)
        self.env.observer.on_bytes(sent, received)
        self._record(flow, flow.state == "allowed", flow.reason, sent=sent, received=received, error=error)

    def _forget_stale(self) -> None:
        now = self._monotonic()
        for flow in list(self.flows.values()):
            if flow.state == "pending" and not flow.judging and not flow.held and now - flow.opened > STALE_S:
                del self.flows[flow.key]

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _flow(
        self,
        key: FlowKey,
        *,
        state: Literal["pending", "allowed"] = "pending",
        reason: str = "",
        inherited: bool = False,
    ) -> Flow:
        ip = ipaddress.IPv4Address(key.dst)
        started, opened = self.env.clock(), self._monotonic()
        return Flow(key, ip, key.dport, started, opened, state=state, reason=reason, inherited=inherited)

    def _record(
        self, flow: Flow, allowed: bool, reason: str, *, sent: int = 0, received: int = 0, error: str | None = None
    ) -> None:
        self.env.observer.on_decision(allowed, reason)
        self.decisions.add(
            EgressDecision(
                time=flow.started,
                name=flow.name,
                ip=str(flow.ip),
                port=flow.port,
                allowed=allowed,
                reason=reason,
                bytes_out=sent,
                bytes_in=received,
                error=error,
            )
        )

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("egress gate of %s: a decision failed", self.sandbox_id, exc_info=task.exception())


__all__ = ["Gate"]
