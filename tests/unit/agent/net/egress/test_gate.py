"""The egress gate's decisions, packet by packet, against a fake queue, conntrack and resolver (no root, no
kernel): what each verdict is, what is held and released, what is logged. The real queue and conntrack are
exercised in ``tests/integration/agent/net/egress``."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from cryobox.agent.net.denylist import deny_networks
from cryobox.agent.net.egress.conntrack import CtEvent, FlowKey
from cryobox.agent.net.egress.decisions import DecisionLog, NoObserver
from cryobox.agent.net.egress.gate import Gate
from cryobox.agent.net.egress.nfqueue import NF_ACCEPT, NF_DROP, NF_REPEAT, QueuedPacket
from cryobox.agent.net.egress.packet import ACK, RST, SYN, parse_tcp
from cryobox.agent.net.egress.proxy import ProxyEnv
from cryobox.agent.net.egress.resolver import Resolver
from cryobox.agent.net.slots import GUEST_IP, MARK_ALLOW, MARK_DENY, MARK_PASS
from cryobox.netpolicy import EgressPolicy

SERVER = "198.51.100.7"  # a documentation address: public as far as the gate's floor (exempted below) is concerned
OTHER = "198.51.100.9"
PSH = 0x08


def tcp(src: str, dst: str, sport: int, dport: int, seq: int, flags: int, payload: bytes = b"", ack: int = 0) -> bytes:
    header = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    total = 20 + len(header) + len(payload)
    ip = struct.pack("!BBHHHBBH", 0x45, 0, total, 0, 0x4000, 64, 6, 0) + socket.inet_aton(src) + socket.inet_aton(dst)
    return ip + header + payload


@dataclass
class FakeQueue:
    verdicts: dict[int, tuple[int, int | None, bytes | None]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # packet ids in the order they got their verdicts
    ids: Iterator[int] = field(default_factory=lambda: iter(range(1, 1 << 30)))

    def __post_init__(self) -> None:
        self._r, self._w = os.pipe()

    def fileno(self) -> int:
        return self._r

    def read(self) -> list[QueuedPacket]:
        return []

    def verdict(self, packet_id: int, verdict: int, *, mark: int | None = None, packet: bytes | None = None) -> None:
        assert packet_id not in self.verdicts, f"packet {packet_id} got two verdicts"
        self.verdicts[packet_id] = (verdict, mark, packet)
        self.order.append(packet_id)

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


@dataclass
class FakeTracker:
    entries: list[CtEvent] = field(default_factory=list)
    marks: dict[FlowKey, int] = field(default_factory=dict)
    sizes: dict[FlowKey, tuple[int, int]] = field(default_factory=dict)
    uncounted: set[FlowKey] = field(default_factory=set)  # counters() fails for these (accounting off)

    def __post_init__(self) -> None:
        self._r, self._w = os.pipe()

    def event_fileno(self) -> int:
        return self._r

    def read_events(self) -> list[CtEvent]:
        return []

    def set_mark(self, key: FlowKey, mark: int) -> bool:
        self.marks[key] = mark
        return True

    def counters(self, key: FlowKey) -> tuple[int, int] | None:
        if key in self.uncounted:
            raise OSError(61, "conntrack entry without counters")
        return self.sizes.get(key)

    def dump(self) -> list[CtEvent]:
        return self.entries

    def delete(self, key: FlowKey) -> bool:
        return True

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


class FakeResolver(Resolver):
    def __init__(self, names: dict[str, list[str]], pinned: dict[str, list[str]] | None = None) -> None:
        super().__init__(None)
        self.names = names
        self.pinned = pinned or {}
        self.asked: list[str] = []

    async def addresses(self, name: str) -> list[ipaddress.IPv4Address]:
        self.asked.append(name)
        return [ipaddress.IPv4Address(a) for a in self.names.get(name, [])]

    def names_of(self, ip: ipaddress.IPv4Address) -> list[str]:
        return [name for name, ips in self.pinned.items() if str(ip) in ips]


@dataclass
class Rig:
    gate: Gate
    queue: FakeQueue
    tracker: FakeTracker
    resolver: FakeResolver
    sport: int = 40000

    def send(self, packet: bytes) -> int:
        queued = QueuedPacket(next(self.queue.ids), packet, 0)
        self.gate.handle(queued)
        return queued.id

    def syn(self, dst: str = SERVER, port: int = 80, seq: int = 1000) -> int:
        self.sport += 1
        return self.send(tcp(GUEST_IP, dst, self.sport, port, seq, SYN))

    def data(self, payload: bytes, dst: str = SERVER, port: int = 80, seq: int = 1001) -> int:
        return self.send(tcp(GUEST_IP, dst, self.sport, port, seq, ACK | PSH, payload))

    def reply(self, payload: bytes, src: str = SERVER, port: int = 80) -> int:
        return self.send(tcp(src, GUEST_IP, port, self.sport, 5000, ACK | PSH, payload, ack=1001))

    def key(self, dst: str = SERVER, port: int = 80) -> FlowKey:
        return FlowKey(GUEST_IP, self.sport, dst, port)

    def log(self) -> list[tuple[str | None, bool, str, str | None]]:
        return [(d.name, d.allowed, d.reason, d.error) for d in self.gate.decisions.read().items]


def marked(mark: int) -> tuple[int, int | None, bytes | None]:
    return (NF_REPEAT, mark, None)


Make = Callable[..., Rig]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    made: list[Rig] = []

    def build(policy: EgressPolicy, resolver: FakeResolver | None = None, **env: object) -> Rig:
        resolver = resolver or FakeResolver({"example.org": [SERVER]})
        floor = deny_networks(exceptions=[ipaddress.IPv4Network("198.51.100.0/24")])
        proxy_env = ProxyEnv(resolver, floor=floor, observer=NoObserver(), **env)  # type: ignore[arg-type]
        queue, tracker = FakeQueue(), FakeTracker()
        rig = Rig(Gate("sb-1", policy, proxy_env, DecisionLog(), queue, tracker), queue, tracker, resolver)
        made.append(rig)
        return rig

    yield build
    for rig in made:
        await rig.gate.close()
        rig.queue.close()
        rig.tracker.close()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_without_name_rules_the_syn_decides_and_the_floor_comes_first(make: Make) -> None:
    rig: Rig = make(EgressPolicy(allow=["198.51.100.0/25"], ports=[80]))
    assert rig.queue.verdicts[rig.syn()] == marked(MARK_ALLOW)
    assert rig.queue.verdicts[rig.syn(port=443)] == marked(MARK_DENY)  # ports
    assert rig.queue.verdicts[rig.syn(dst="10.1.2.3")] == marked(MARK_DENY)  # the floor: private
    assert rig.queue.verdicts[rig.syn(dst="198.51.100.200")] == marked(MARK_DENY)  # nothing allows it
    assert [(reason, allowed) for _, allowed, reason, _ in rig.log()] == [
        ("port", False),
        ("floor", False),
        ("default", False),
    ]
    assert rig.gate.open_connections() == 1 and not rig.resolver.asked


async def test_a_name_decides_from_the_first_bytes_held_across_segments(make: Make) -> None:
    rig: Rig = make(EgressPolicy(allow=["example.org"]))
    syn = rig.syn()
    await settle()  # the SYN waits for the lookup of the allowed names (example.org resolves to SERVER)
    assert rig.queue.verdicts[syn] == marked(MARK_PASS)
    head = b"GET / HTTP/1.1\r\nHo"
    first = rig.data(head)
    assert first not in rig.queue.verdicts  # held: the request line alone names nothing
    assert rig.queue.verdicts[rig.data(head, seq=1001)] == (NF_DROP, None, None)  # a retransmission of held bytes
    second = rig.data(b"st: example.org\r\n\r\n", seq=1001 + len(head))
    await settle()
    assert rig.queue.verdicts[first] == rig.queue.verdicts[second] == marked(MARK_ALLOW)
    assert rig.gate.open_connections() == 1
    # it ends: conntrack says TIME_WAIT; the log gets it with conntrack's byte counts
    rig.tracker.sizes[rig.key()] = (700, 9000)
    rig.gate.handle_events([CtEvent(rig.key(), False, 7, MARK_ALLOW, None, None)])
    assert rig.log() == [("example.org", True, "allow-name", None)]
    assert rig.gate.decisions.read().items[0].bytes_in == 9000 and rig.gate.open_connections() == 0


async def test_a_denied_name_on_a_shared_address_is_reset_and_stays_denied(make: Make) -> None:
    resolver = FakeResolver({}, pinned={"cdn-a.example.net": [SERVER]})  # the guest resolved cdn-a here
    rig: Rig = make(EgressPolicy(allow=["*.example.net"], deny=["cdn-b.example.net"]), resolver)
    syn = rig.syn()
    await settle()
    assert rig.queue.verdicts[syn] == marked(MARK_PASS)  # cdn-a's address: a name may allow it
    data = rig.data(b"GET / HTTP/1.1\r\nHost: cdn-b.example.net\r\n\r\n")
    await settle()
    assert rig.queue.verdicts[data] == marked(MARK_DENY)
    assert rig.log() == [("cdn-b.example.net", False, "deny-name", None)]
    # queued before the deny mark took: still denied; what the server sends becomes a reset for the guest
    assert rig.queue.verdicts[rig.data(b"more", seq=5000)] == marked(MARK_DENY)
    verdict, mark, packet = rig.queue.verdicts[rig.reply(b"hello")]
    assert (verdict, mark) == (NF_ACCEPT, MARK_PASS) and packet is not None
    reset = parse_tcp(packet)
    assert reset is not None and reset.flags == RST | ACK and reset.seq == 5000 and reset.dst == GUEST_IP
    assert not resolver.asked  # a denied name is never looked up
    # an address no allowed name resolved to: not even the SYN goes out
    syn = rig.syn(dst=OTHER)
    await settle()
    assert rig.queue.verdicts[syn] == marked(MARK_DENY)


async def test_a_claimed_name_holds_only_at_its_own_addresses(make: Make) -> None:
    resolver = FakeResolver({"example.org": [SERVER], "other.example.com": [OTHER]})
    rig: Rig = make(EgressPolicy(default="allow", deny=["evil.example"]), resolver)
    assert rig.queue.verdicts[rig.syn(dst=OTHER)] == marked(MARK_PASS)  # default allow; a name could still deny
    data = rig.data(b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n", dst=OTHER)
    await settle()
    assert rig.queue.verdicts[data] == marked(MARK_ALLOW)  # example.org is not at OTHER, but OTHER is allowed anyway
    rig2: Rig = make(EgressPolicy(allow=["example.org", "198.51.100.9/32"], deny=["evil.example"]), resolver)
    rig2.syn(dst=SERVER)
    await settle()
    data = rig2.data(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    await settle()
    assert rig2.queue.verdicts[data] == marked(MARK_DENY) and rig2.log()[-1][2] == "deny-name"
    rig3: Rig = make(EgressPolicy(allow=["example.org", "api.example.org"]), FakeResolver({"example.org": [SERVER]}))
    rig3.syn(dst=SERVER)
    await settle()
    data = rig3.data(b"GET / HTTP/1.1\r\nHost: api.example.org\r\n\r\n")  # allowed name, not at this address
    await settle()
    assert rig3.queue.verdicts[data] == marked(MARK_DENY) and rig3.log() == [
        ("api.example.org", False, "mismatch", None)
    ]


async def test_a_server_that_speaks_first_waits_and_is_judged_by_address(make: Make) -> None:
    rig: Rig = make(EgressPolicy(allow=["example.org"]), first_bytes_s=0.05)
    rig.syn(port=22)
    await settle()
    synack = rig.send(tcp(SERVER, GUEST_IP, 22, rig.sport, 4999, SYN | ACK, ack=1001))
    assert rig.queue.verdicts[synack] == marked(MARK_PASS)  # the handshake passes
    banner = rig.reply(b"SSH-2.0-x\r\n", port=22)
    assert banner not in rig.queue.verdicts  # what it says waits for the decision
    await asyncio.sleep(0.1)
    verdict, mark, packet = rig.queue.verdicts[banner]
    assert (verdict, mark) == (NF_ACCEPT, MARK_PASS) and packet is not None and parse_tcp(packet).flags & RST  # type: ignore[union-attr]
    assert rig.log() == [(None, False, "default", None)]  # no name: its address, which nothing allows


async def test_a_change_cuts_what_it_denies_and_inherited_connections_by_what_it_can_tell(make: Make) -> None:
    rig: Rig = make(EgressPolicy(allow=["198.51.100.0/24"]))
    rig.syn()
    allowed = rig.key()
    rig.tracker.sizes[allowed] = (10, 20)
    assert rig.gate.set_policy(EgressPolicy(allow=["198.51.100.0/25"])) == 0  # still allowed
    assert rig.gate.set_policy(EgressPolicy()) == 1
    assert rig.tracker.marks == {allowed: MARK_DENY} and rig.log()[-1] == (None, True, "allow-cidr", "cut")
    assert rig.queue.verdicts[rig.reply(b"late")][0] == NF_ACCEPT  # the server's next packet: a reset for the guest
    # a successor adopts live connections (not ended ones) and judges them by address while names play no part
    old = FlowKey(GUEST_IP, 50000, SERVER, 443)
    ended = FlowKey(GUEST_IP, 50001, SERVER, 443)
    entries = [CtEvent(old, False, 3, MARK_ALLOW, 1, 1), CtEvent(ended, False, 7, MARK_ALLOW, 1, 1)]
    fresh: Rig = make(EgressPolicy(allow=["198.51.100.0/24"]))
    fresh.tracker.entries = entries
    fresh.gate.start()  # a new sandbox's slot: no dump (it walks the host's whole conntrack table)
    assert fresh.gate.open_connections() == 0
    heir: Rig = make(EgressPolicy(allow=["198.51.100.0/24"]))
    heir.tracker.entries = entries
    heir.gate.start(adopt=True)
    assert heir.gate.open_connections() == 1
    assert heir.gate.set_policy(EgressPolicy(allow=["198.51.100.0/24"], ports=[443])) == 0
    assert heir.gate.set_policy(EgressPolicy(allow=["198.51.100.0/24", "example.org"])) == 1  # its name is unknown
    assert heir.tracker.marks == {old: MARK_DENY}
    assert old in heir.gate.known() and allowed in rig.gate.known()  # what a detach deletes from conntrack
    # a connection conntrack has no byte counts for is still cut and logged (with none)
    rig.gate.set_policy(EgressPolicy(allow=["198.51.100.0/24"]))
    assert rig.queue.verdicts[rig.syn()] == marked(MARK_ALLOW)
    rig.tracker.uncounted.add(rig.key())
    assert rig.gate.set_policy(EgressPolicy(allow=["198.51.100.7/32"], ports=[443])) == 1
    assert rig.gate.decisions.read().items[-1].bytes_in == 0


async def test_at_most_max_open_connections(make: Make) -> None:
    rig: Rig = make(EgressPolicy(default="allow"), max_open=2)
    assert [rig.queue.verdicts[rig.syn()] for _ in range(3)] == [marked(MARK_ALLOW)] * 2 + [marked(MARK_DENY)]
    assert rig.log() == [(None, False, "limit", None)]
    assert rig.queue.verdicts[rig.send(b"\x60" + bytes(60))] == (NF_DROP, None, None)  # not IPv4 TCP


async def test_what_waited_goes_out_in_the_order_it_came(make: Make) -> None:
    """A server that greets and closes before the guest's first bytes: its greeting and FIN reach the guest before
    the guest's bytes reach it (which a closed server answers with a reset)."""
    rig: Rig = make(EgressPolicy(allow=["198.51.100.0/24", "example.org"]))
    rig.syn(port=7000)
    greeting = rig.reply(b"hi", port=7000)
    fin = rig.send(tcp(SERVER, GUEST_IP, 7000, rig.sport, 5002, ACK | 0x01, ack=1001))
    data = rig.data(b"GET / HTTP/1.0\r\n\r\n", port=7000)
    await settle()
    assert rig.queue.order[-3:] == [greeting, fin, data]
    assert {rig.queue.verdicts[i] for i in (greeting, fin, data)} == {marked(MARK_ALLOW)}
