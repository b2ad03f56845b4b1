"""Egress enforcement and the guests' name server, for real, in both modes: a real slot (netns, veth, nft and
queue rules of today) whose tap is replaced by a fake guest's veth, the host table, the egress service on this
test's event loop, and the tests' own internet (:mod:`tests.support.internet`: DNS, HTTP and HTTPS under several
names, two names on one address, names answering private addresses). Every connection the guest opens is queued
to the egress gate and forwarded by the kernel (``forward``), or redirected to the proxy (``proxy``), exactly as a
VM's would. Nothing leaves this machine.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from pyroute2 import IPRoute

from cryobox.agent.net import SlotPlan, create_slot, destroy_slot, reclaim
from cryobox.agent.net.denylist import deny_networks
from cryobox.agent.net.egress.metrics import EgressMetrics
from cryobox.agent.net.egress.proxy import ProxyEnv
from cryobox.agent.net.egress.resolver import Resolver, Upstream
from cryobox.agent.net.egress.service import EgressService
from cryobox.agent.net.firewall import Firewall
from cryobox.agent.net.slots import PROXY_PORT, EgressMode, Slot
from cryobox.netpolicy import EgressPolicy
from tests.integration.agent.net.egress.guestside import (
    DENIED,
    http,
    https,
    open_download,
    raw,
    raw6,
    read,
    resolve,
    udp,
)
from tests.support.internet import Internet, internet
from tests.support.netutil import OUTSIDE_RANGE, attach_fake_guest, in_thread_netns

SANDBOX = "sb-egress"


@dataclass
class Rig:
    net: Internet
    slot: Slot
    guest: str

    @property
    def forward(self) -> bool:
        return self.slot.egress == "forward"


def _floor() -> list[ipaddress.IPv4Network]:
    return deny_networks(exceptions=[ipaddress.IPv4Network(OUTSIDE_RANGE)])


@pytest.fixture(scope="module", params=["forward", "proxy"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    mode: EgressMode = request.param
    tag = secrets.token_hex(3)
    plan = SlotPlan(tag, f"10.{random.randint(230, 239)}.0.0/16", egress=mode)
    slot = plan.slot(0)
    firewall = Firewall(plan, floor=_floor())
    try:
        with internet(tag) as net:
            firewall.ensure(fresh=True)
            create_slot(slot)
            guest = attach_fake_guest(slot)
            yield Rig(net, slot, guest)
    finally:
        destroy_slot(slot)
        reclaim(tag)
        firewall.remove()


@pytest.fixture
async def service(rig: Rig) -> AsyncIterator[EgressService]:
    metrics = EgressMetrics()
    env = ProxyEnv(Resolver(Upstream(rig.net.dns)), floor=_floor(), observer=metrics, first_bytes_s=0.3)
    egress = EgressService(env, metrics=metrics, mode=rig.slot.egress)
    rig.net.clear_queries()
    try:
        yield egress
    finally:
        await egress.close()


async def _attach(service: EgressService, rig: Rig, **policy: object) -> None:
    await service.attach(SANDBOX, rig.slot.netns, EgressPolicy.model_validate(policy))


def _ip(rig: Rig, name: str) -> str:
    return rig.net.addr(name)


async def _ended(service: EgressService) -> None:
    """Until every connection the guest opened has ended here (``forward``: conntrack's word comes a moment after
    the guest's socket closed), so the log holds them all."""
    for _ in range(100):
        if not service.open_connections(SANDBOX):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{service.open_connections(SANDBOX)} connection(s) still open")


async def test_allow_by_name_and_wildcard_deny_wins_on_a_shared_address(rig: Rig, service: EgressService) -> None:
    await _attach(service, rig, allow=["example.org", "*.example.net"], deny=["cdn-b.example.net"])
    # as a client does: resolve first (forward mode opens an address a wildcard allows only once a name led to it)
    assert await asyncio.to_thread(resolve, rig.guest, "cdn-a.example.net") == [_ip(rig, "cdn-a.example.net")]
    got = await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), "example.org")
    assert got["host"] == "example.org" and got["server"] == _ip(rig, "example.org")
    assert (await asyncio.to_thread(http, rig.guest, _ip(rig, "cdn-a.example.net"), "cdn-a.example.net"))[
        "host"
    ] == "cdn-a.example.net"
    # cdn-b shares cdn-a's address: it is told apart by name, and deny wins over the wildcard allow
    assert _ip(rig, "cdn-b.example.net") == _ip(rig, "cdn-a.example.net")
    assert await asyncio.to_thread(http, rig.guest, _ip(rig, "cdn-b.example.net"), "cdn-b.example.net") == DENIED
    assert await asyncio.to_thread(http, rig.guest, _ip(rig, "other.example.com"), "other.example.com") == DENIED
    # TLS: decided by SNI, same rules
    ctx = rig.net.client_context
    assert (await asyncio.to_thread(https, rig.guest, _ip(rig, "cdn-a.example.net"), "cdn-a.example.net", ctx()))[
        "sni"
    ] == "cdn-a.example.net"
    assert (
        await asyncio.to_thread(https, rig.guest, _ip(rig, "cdn-b.example.net"), "cdn-b.example.net", ctx()) == DENIED
    )
    await _ended(service)
    log = service.read_log(SANDBOX)
    decided = [(d.name, d.allowed, d.reason) for d in log.items]
    assert ("cdn-b.example.net", False, "deny-name") in decided and ("example.org", True, "allow-name") in decided
    allowed = [d for d in log.items if d.allowed]
    assert all(d.bytes_in > 0 and d.bytes_out > 0 for d in allowed)
    assert service.metrics is not None
    text = await service.metrics.text()
    assert 'cryobox_egress_decisions_total{decision="denied",reason="deny-name"} 2.0' in text


async def test_a_name_rule_never_opens_raw_addresses_and_a_claimed_name_goes_where_the_proxy_resolved(
    rig: Rig, service: EgressService
) -> None:
    await _attach(service, rig, allow=["example.org"])
    # no name (a raw TCP protocol, an IP literal Host): judged by address only, and no CIDR rule allows it
    assert await asyncio.to_thread(raw, rig.guest, _ip(rig, "example.org"), 7000) == DENIED
    assert await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), _ip(rig, "example.org")) == DENIED
    # the guest asks for other.example.com's address but claims example.org: the proxy connects to example.org's
    # address instead; the gate lets the connection go only where it asked, which no name here allows
    other = _ip(rig, "other.example.com")
    got = await asyncio.to_thread(http, rig.guest, other, "example.org")
    got_tls = await asyncio.to_thread(https, rig.guest, other, "example.org", rig.net.client_context())
    if rig.forward:
        assert got == DENIED and got_tls == DENIED
        assert {(d.ip, d.reason) for d in service.read_log(SANDBOX).items} >= {(other, "default")}
    else:
        assert got["server"] == _ip(rig, "example.org") and got["host"] == "example.org"
        assert got_tls["server"] == _ip(rig, "example.org") and got_tls["sni"] == "example.org"


async def test_cidr_rules_ports_and_the_floor(rig: Rig, service: EgressService) -> None:
    await _attach(service, rig, allow=[rig.net.cidr], ports=[80, 7000])
    assert (await asyncio.to_thread(raw, rig.guest, _ip(rig, "example.org"), 7000)).startswith("SSH-2.0-test")
    assert (await asyncio.to_thread(http, rig.guest, _ip(rig, "api.example.com"), None))["server"] == _ip(
        rig, "api.example.com"
    )
    ctx = rig.net.client_context()
    assert await asyncio.to_thread(https, rig.guest, _ip(rig, "example.org"), "example.org", ctx) == DENIED  # port
    # the floor: no policy opens private, link-local or loopback addresses, whatever the name says
    await _attach(service, rig, default="allow", allow=["rebind.example.org", "10.0.0.0/8", "169.254.0.0/16"])
    for name in ("rebind.example.org", "meta.example.org"):
        if rig.forward:  # the connection goes where the guest asked: the private address its name resolved to
            answer = await asyncio.to_thread(resolve, rig.guest, name)
            assert isinstance(answer, list) and len(answer) == 1
            private = answer[0]
            assert ipaddress.IPv4Address(private).is_private
            assert await asyncio.to_thread(http, rig.guest, private, name) == DENIED
        else:  # the proxy connects where the name resolves: the private address
            assert await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), name) == DENIED
    assert await asyncio.to_thread(raw, rig.guest, "10.0.0.5", 80) == DENIED
    assert await asyncio.to_thread(raw, rig.guest, "127.0.0.1", 22) == DENIED
    reasons = {(d.name, d.reason) for d in service.read_log(SANDBOX).items if not d.allowed}
    if rig.forward:  # refused as it opened, before any name
        assert {(None, "floor"), (None, "port")} <= reasons
    else:
        assert {("rebind.example.org", "floor"), ("meta.example.org", "floor"), (None, "port")} <= reasons


async def test_dns_is_answered_per_policy_and_denied_names_never_go_upstream(rig: Rig, service: EgressService) -> None:
    await _attach(service, rig, allow=["*.example.net", "example.org"], deny=["cdn-b.example.net"])
    assert await asyncio.to_thread(resolve, rig.guest, "example.org") == [_ip(rig, "example.org")]
    assert await asyncio.to_thread(resolve, rig.guest, "cdn-a.example.net", tcp=True) == [_ip(rig, "cdn-a.example.net")]
    assert await asyncio.to_thread(resolve, rig.guest, "cdn-b.example.net") == "NXDOMAIN"
    assert await asyncio.to_thread(resolve, rig.guest, "other.example.com") == "NXDOMAIN"
    assert "cdn-b.example.net" not in rig.net.queries and "other.example.com" not in rig.net.queries
    # the guest cannot ask any other server: UDP other than its own name server goes nowhere
    assert await asyncio.to_thread(resolve, rig.guest, "example.org", server=rig.net.dns) == "timeout"
    # with egress open, every public name resolves
    service.update(SANDBOX, EgressPolicy(default="allow"))
    assert await asyncio.to_thread(resolve, rig.guest, "other.example.com") == [_ip(rig, "other.example.com")]
    denied = [d for d in service.read_log(SANDBOX).items if d.reason == "dns"]
    assert {d.name for d in denied} == {"cdn-b.example.net", "other.example.com"}


async def test_udp_quic_and_ipv6_do_not_leave(rig: Rig, service: EgressService) -> None:
    await _attach(service, rig, default="allow")
    assert (await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), "example.org"))["host"] == "example.org"
    assert await asyncio.to_thread(udp, rig.guest, _ip(rig, "example.org"), 443) == "timeout"  # QUIC
    assert await asyncio.to_thread(udp, rig.guest, _ip(rig, "example.org"), 9999) == "timeout"
    assert await asyncio.to_thread(resolve, rig.guest, "v6.example.org") == []  # an AAAA-only name: no A
    # IPv6: give the guest and its gateway addresses; the slot still lets nothing of it in or through
    await asyncio.to_thread(_ipv6_link, rig)
    # dropped (ICMPv6 neighbour discovery included): never refused, as the gateway's kernel would without rules
    for port in (53, PROXY_PORT):
        assert await asyncio.to_thread(raw6, rig.guest, GATEWAY6, port) in ("timeout", "unreachable")
    assert await asyncio.to_thread(raw6, rig.guest, rig.net.server_ip6, 80) == "unreachable"


GATEWAY6 = "fd00:cb:fe::1"


def _ipv6_link(rig: Rig) -> None:
    def add(name: str, ifname: str, address: str) -> None:
        def inside() -> None:
            with IPRoute() as ipr:
                idx = ipr.link_lookup(ifname=ifname)[0]
                ipr.addr("replace", index=idx, address=address, prefixlen=64, flags=0x02)  # IFA_F_NODAD

        in_thread_netns(name, inside)

    add(rig.slot.netns, rig.slot.tap, GATEWAY6)
    add(rig.guest, "eth0", "fd00:cb:fe::2")


async def test_live_update_both_ways_cuts_what_it_denies(rig: Rig, service: EgressService) -> None:
    await _attach(service, rig)  # nothing allowed
    ip = _ip(rig, "example.org")
    assert await asyncio.to_thread(http, rig.guest, ip, "example.org") == DENIED
    started = time.monotonic()
    service.update(SANDBOX, EgressPolicy(allow=["example.org"]))
    assert (await asyncio.to_thread(http, rig.guest, ip, "example.org"))["host"] == "example.org"
    assert time.monotonic() - started < 1.0
    # a long download in flight, then the policy narrows: the open connection is cut at once
    download = asyncio.create_task(asyncio.to_thread(http, rig.guest, ip, "example.org", path="/blob?size=2000000000"))
    for _ in range(100):
        if service.open_connections(SANDBOX):
            break
        await asyncio.sleep(0.05)
    assert service.update(SANDBOX, EgressPolicy()) == 1
    assert await asyncio.wait_for(download, 10) == DENIED  # reset mid-transfer (2 GB would take far longer)
    cut = [d for d in service.read_log(SANDBOX).items if d.error == "cut"]
    assert len(cut) == 1 and cut[0].bytes_in > 0
    assert await asyncio.to_thread(http, rig.guest, ip, "example.org") == DENIED


@pytest.mark.parametrize("rig", ["forward"], indirect=True)
async def test_forwarded_connections_outlive_the_service_and_its_successor_cuts_them(
    rig: Rig, service: EgressService
) -> None:
    """An agent that stops (its VMs kept) leaves the connections the kernel forwards going; the next one adopts
    them, and cuts them when a policy change needs the names they were allowed by."""
    await _attach(service, rig, allow=[rig.net.cidr])
    sock = await asyncio.to_thread(open_download, rig.guest, _ip(rig, "example.org"), "example.org")
    try:
        await service.close()  # the agent stops: nothing serves the slot's queue any more
        assert await asyncio.to_thread(read, sock, 1 << 20) == 1 << 20  # the kernel still forwards it
        assert await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), "example.org") == DENIED  # new: reset
        successor = EgressService(service.env, mode="forward")
        try:
            await successor.attach(SANDBOX, rig.slot.netns, EgressPolicy(allow=[rig.net.cidr]), adopt=True)
            assert successor.open_connections(SANDBOX) == 1  # adopted
            assert await asyncio.to_thread(read, sock, 1 << 20) == 1 << 20
            # without name rules it is judged by its address (still allowed), with them it cannot be
            assert successor.update(SANDBOX, EgressPolicy(allow=[rig.net.cidr], ports=[80])) == 0
            assert successor.update(SANDBOX, EgressPolicy(allow=["example.org"])) == 1  # names it cannot tell
            with pytest.raises(ConnectionResetError):
                await asyncio.to_thread(read, sock, 8 * 2**30)
            (cut,) = [d for d in successor.read_log(SANDBOX).items if d.error == "cut"]
            assert cut.bytes_in > 2 << 20 and cut.reason == "inherited"
        finally:
            await successor.close()
    finally:
        sock.close()


async def test_detach_stops_serving_and_forget_drops_the_log(rig: Rig, service: EgressService) -> None:
    await _attach(service, rig, default="allow")
    assert (await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), "example.org"))["host"] == "example.org"
    sock = await asyncio.to_thread(open_download, rig.guest, _ip(rig, "example.org"), "example.org")
    await service.detach(SANDBOX)
    try:  # what was open ends with it (forward: its conntrack entry is gone, the guest's next packet is reset)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            await asyncio.to_thread(sock.sendall, b"\n")
            await asyncio.to_thread(read, sock, 8 * 2**30)
    finally:
        sock.close()
    assert await asyncio.to_thread(http, rig.guest, _ip(rig, "example.org"), "example.org") == DENIED  # no proxy: RST
    assert service.read_log(SANDBOX).items
    await service.forget(SANDBOX)
    assert service.read_log(SANDBOX).items == []
