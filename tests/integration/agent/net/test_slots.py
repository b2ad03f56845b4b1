"""Real network slots (root): netns/veth/tap layout, 200-slot churn leaves nothing, reclaim, and the firewall.

Every test uses a random tag and a random 10.23x.0.0/16 so it never meets a running cryobox (10.200.0.0/16) or
another test. Traffic only ever flows between this host and namespaces the tests create. A "fake guest" is a
netns whose ``eth0`` (MAC/IP of the baked guest) is veth-paired with a ``tap0`` that replaces the slot's real tap:
from the slot's point of view it is indistinguishable from QEMU's guest, so DNAT, SNAT and both nft tables are
exercised exactly as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyroute2 import IPRoute

from cryobox.agent.net import (
    GATEWAY_IP,
    GATEWAY_MAC,
    GUEST_IP,
    Firewall,
    NetworkSetupError,
    SlotPlan,
    SlotPool,
    create_slot,
    destroy_slot,
    list_tagged,
    reclaim,
)
from cryobox.agent.net.netlink import Reclaimed, in_netns
from cryobox.agent.net.slots import EGRESS_MODES
from tests.support.netutil import (
    REACH_S,
    Listener,
    attach_fake_guest,
    in_thread_netns,
    outside_network,
    probe,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nft need root")

T = TypeVar("T")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
IFF_UP = 0x1
DENIED = "timeout"  # nft drops: the peer never answers, so a denied connect times out (not refused)


def host_link_names() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def assert_nothing_tagged(tag: str) -> None:
    assert list_tagged(tag) == ([], [])
    netns_dir = Path("/run/netns")
    assert not [n for n in (os.listdir(netns_dir) if netns_dir.is_dir() else []) if tag in n]
    assert not [n for n in host_link_names() if tag in n]


@pytest.fixture
def plan(request: pytest.FixtureRequest) -> Iterator[SlotPlan]:
    tag = secrets.token_hex(3)
    plan = SlotPlan(tag, f"10.{random.randint(230, 239)}.0.0/16", egress=getattr(request, "param", "forward"))
    try:
        yield plan
    finally:
        reclaim(tag)
        Firewall(plan).remove()


@pytest.fixture
def firewall(plan: SlotPlan) -> Iterator[Firewall]:
    fw = Firewall(plan)  # forward mode turns the host's routing on, and off again with the last cryobox table
    try:
        fw.ensure(fresh=True)
        yield fw
    finally:
        fw.remove()


@pytest.fixture
def outside(plan: SlotPlan) -> Iterator[tuple[str, str]]:
    """A stand-in for "the internet": a netns behind its own non-cb veth from the host. Yields (cidr, server ip)."""
    with outside_network(plan.tag) as found:
        yield found


@contextlib.contextmanager
def routing_on() -> Iterator[None]:
    """The host routes while this lasts, turned on and back off the way forward-mode agents do it (never behind
    the back of one that runs meanwhile)."""
    fw = Firewall(SlotPlan(secrets.token_hex(3), "10.255.252.0/30"))
    fw.ensure(fresh=True)
    try:
        yield
    finally:
        fw.remove()


def _kind(link: Any) -> str | None:
    info = link.get_attr("IFLA_LINKINFO")
    return None if info is None else str(info.get_attr("IFLA_INFO_KIND"))


def _inspect_netns() -> dict[str, Any]:
    with IPRoute() as ipr:
        links = {
            link.get_attr("IFLA_IFNAME"): {
                "up": bool(link["flags"] & IFF_UP),
                "mac": link.get_attr("IFLA_ADDRESS"),
                "kind": _kind(link),
            }
            for link in ipr.get_links()
        }
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        addrs = {(names[a["index"]], a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(family=2)}
        default = [r.get_attr("RTA_GATEWAY") for r in ipr.get_routes(family=2) if r["dst_len"] == 0]
    return {"links": links, "addrs": addrs, "default": default, "forward": IP_FORWARD.read_text().strip()}


def test_create_slot_builds_the_layout(plan: SlotPlan) -> None:
    slot = plan.slot(3)
    started = time.perf_counter()
    create_slot(slot)
    print(f"cold create_slot: {1000 * (time.perf_counter() - started):.1f} ms")
    with IPRoute() as ipr:
        (idx,) = ipr.link_lookup(ifname=slot.host_veth)
        link = ipr.get_links(idx)[0]
        assert link["flags"] & IFF_UP
        assert _kind(link) == "veth"
        assert [(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=idx, family=2)] == [
            (slot.host_ip, 30)
        ]
    inside = in_thread_netns(slot.netns, _inspect_netns)
    assert inside["links"]["lo"]["up"]
    assert inside["links"]["eth0"]["up"] and inside["links"]["eth0"]["kind"] == "veth"
    assert inside["links"]["tap0"] == {"up": True, "mac": GATEWAY_MAC, "kind": "tun"}
    assert set(inside["links"]) == {"lo", "eth0", "tap0"}
    assert {("eth0", slot.address, 30), ("tap0", GATEWAY_IP, 30)} <= inside["addrs"]
    assert inside["default"] == [slot.host_ip]
    assert inside["forward"] == "1"  # the slot's own (the host's is the host table's business: test_firewall)
    rules = subprocess.run(
        ["nsenter", f"--net=/run/netns/{slot.netns}", "nft", "list", "table", "inet", "cryobox"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"dnat ip to {GUEST_IP}" in rules and f"snat ip to {slot.address}" in rules
    assert list_tagged(plan.tag) == ([slot.netns], [slot.host_veth])

    with pytest.raises(NetworkSetupError):
        create_slot(slot)  # exists: refused without harming the live slot
    assert list_tagged(plan.tag) == ([slot.netns], [slot.host_veth])

    destroy_slot(slot)
    destroy_slot(slot)  # idempotent
    assert_nothing_tagged(plan.tag)


async def test_200_slots_acquired_released_reacquired_leave_nothing_behind(plan: SlotPlan, firewall: Firewall) -> None:
    pool = SlotPool(plan, size=8, max_idle=16)
    try:
        await pool.wait_warm()
        warm = [await pool.acquire() for _ in range(8)]
        warm_stats = pool.stats()
        assert warm_stats.warm_acquires == 8
        print(
            f"warm acquire: mean {warm_stats.mean_acquire_s * 1e6:.0f} us, max {warm_stats.max_acquire_s * 1e6:.0f} us"
        )
        assert warm_stats.max_acquire_s < 0.05
        first = warm + [await pool.acquire() for _ in range(192)]
        assert len({s.index for s in first}) == 200
        assert len((await asyncio.to_thread(list_tagged, plan.tag)).netns) >= 200
        for slot in first:
            await pool.release(slot)
        assert pool.stats().idle <= 16
        second = [await pool.acquire() for _ in range(200)]
        assert len({s.index for s in second}) == 200
        for slot in second[:150]:
            await pool.release(slot)
        stats = pool.stats()
        print(f"pool after churn: {stats}")
        assert stats.recycled >= 16 and stats.destroyed > 0
    finally:
        await pool.close()  # 50 slots still leased: close must take them too
    # pyroute2's sync API refuses to run on a thread whose event loop is running: always go through a thread
    await asyncio.to_thread(assert_nothing_tagged, plan.tag)
    assert await asyncio.to_thread(reclaim, plan.tag) == Reclaimed(0, 0)
    await asyncio.to_thread(firewall.remove)
    assert not await asyncio.to_thread(firewall.exists)


CRASHING_AGENT = """
import asyncio, os, sys
from cryobox.agent.net import SlotPlan, SlotPool

async def main() -> None:
    pool = SlotPool(SlotPlan(sys.argv[1], sys.argv[2]), size=4)
    await pool.wait_warm()
    await pool.acquire()
    await pool.acquire()
    os._exit(3)  # no close(): leftovers stay behind, as after a crash

asyncio.run(main())
"""


def test_reclaim_removes_a_crashed_pools_leftovers(plan: SlotPlan) -> None:
    proc = subprocess.run([sys.executable, "-c", CRASHING_AGENT, plan.tag, plan.cidr], timeout=120, check=False)
    assert proc.returncode == 3
    left = list_tagged(plan.tag)
    assert len(left.netns) >= 4 and len(left.links) == len(left.netns)
    other = SlotPlan(secrets.token_hex(3), plan.cidr)
    assert reclaim(other.tag) == Reclaimed(0, 0)  # another tag's reclaim leaves them alone
    # a restarting agent with adopted VMs leaves whole slots to its pool, which destroys them after it starts
    deferred = reclaim(plan.tag, defer=True)
    assert deferred[:2] == (0, 0) and list_tagged(plan.tag) == left
    assert [plan.slot(i).netns for i in deferred.deferred] == sorted(left.netns, key=lambda n: int(n.rsplit("-", 1)[1]))
    pool = SlotPool(plan, size=0)
    pool.reclaim_later(deferred.deferred[1:])
    asyncio.run(pool.close())  # closed before it started (a kill stop): the leftovers it was given go anyway
    assert list_tagged(plan.tag).netns == [plan.slot(deferred.deferred[0]).netns]
    assert reclaim(plan.tag) == Reclaimed(1, 1)
    assert_nothing_tagged(plan.tag)


@pytest.mark.parametrize("plan", EGRESS_MODES, indirect=True)
def test_guests_reach_nothing_no_gate_or_proxy_allowed(
    plan: SlotPlan, firewall: Firewall, outside: tuple[str, str]
) -> None:
    a, b = plan.slot(0), plan.slot(1)
    create_slot(a)
    create_slot(b)
    guest_a, guest_b = attach_fake_guest(a), attach_fake_guest(b)
    on_b = Listener(guest_b, GUEST_IP)
    on_host = Listener(None, "0.0.0.0")
    cidr, server_ip = outside
    on_outside = Listener(f"cryobox-{plan.tag}-out", server_ip)
    try:
        # the host reaches each guest at its slot address (DNAT to the one baked guest IP)
        assert probe(None, b.address, on_b.port, timeout=REACH_S) == "ok"
        on_a = Listener(guest_a, GUEST_IP)
        try:
            assert probe(None, a.address, on_a.port, timeout=REACH_S) == "ok"
        finally:
            on_a.close()
        # controls: the host listener and the outside server are up and reachable from the host itself
        assert probe(None, a.host_ip, on_host.port, timeout=REACH_S) == "ok"
        assert probe(None, server_ip, on_outside.port, timeout=REACH_S) == "ok"

        # every TCP connection of a guest waits for its slot's egress gate (forward) or goes to its proxy (proxy):
        # none runs here, so each is refused by the slot itself (a reset), whatever it aimed at
        for target, port in ((b.address, on_b.port), (a.host_ip, on_host.port), (server_ip, on_outside.port)):
            assert probe(guest_a, target, port) == "refused"
        # the slot's namespace itself (where QEMU runs) reaches nothing either
        for target, port in ((b.address, on_b.port), (a.host_ip, on_host.port), (server_ip, on_outside.port)):
            assert probe(a.netns, target, port) == DENIED
        if plan.egress == "forward":
            # two walls: the slot's own output rule, and behind it the host table, which routes a slot's TCP out
            # (the decided connections of its guest) but never to another slot or to the host
            subprocess.run(in_netns(a.netns, "nft", "flush", "chain", "inet", "cryobox", "output"), check=True)
            assert probe(a.netns, server_ip, on_outside.port, timeout=REACH_S) == "ok"
            assert probe(a.netns, b.address, on_b.port) == DENIED
            assert probe(a.netns, a.host_ip, on_host.port) == DENIED
            assert probe(guest_a, server_ip, on_outside.port) == "refused"  # the guest still waits for a gate
            return
        # control: those drops are the host table's doing (without it a host that forwards routes slot to slot;
        # whether this host forwards is its own setting: on for the control as a forward-mode agent turns it on)
        with routing_on():
            firewall.remove()
            # routed to b's slot now, where only the host's own end of the veth is DNAT'ed to the guest: refused
            assert probe(a.netns, b.address, on_b.port) == "refused"
            assert probe(a.netns, a.host_ip, on_host.port, timeout=REACH_S) == "ok"
            assert probe(guest_a, b.address, on_b.port) == "refused"  # the guest still only meets the redirect
            firewall.ensure()
            assert probe(a.netns, b.address, on_b.port) == DENIED
    finally:
        for listener in (on_b, on_host, on_outside):
            listener.close()
        destroy_slot(a)
        destroy_slot(b)
