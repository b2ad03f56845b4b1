"""Network slots without root: slot arithmetic, firewall scripts against a fake nft, pool logic with a fake builder."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import re
from pathlib import Path

import pytest

from cryobox.agent.net import GUEST_IP, Slot, SlotPlan, SlotPool, tag_for
from cryobox.agent.net.firewall import Firewall, live_netns, prune_records, remove_table, was_file
from cryobox.agent.net.netlink import in_netns, slot_queue_rules, slot_rules_digest, slot_ruleset
from cryobox.agent.net.pool import IndexAllocator
from cryobox.agent.net.slots import (
    EGRESS_MODES,
    IFNAME_MAX,
    MARK_ALLOW,
    MARK_DENY,
    MARK_PASS,
    MAX_SLOTS,
    PROXY_PORT,
)
from cryobox.errors import HostUnavailable, InvalidArgument, StateError
from cryobox.netpolicy import parse_cidrs
from tests.support.net import FakeBuilder, FakeNft

TAG = "0a1b2c"

# -- slot arithmetic ---------------------------------------------------------------------------------------------


def test_capacity_and_first_last_slot_of_a_slash16() -> None:
    plan = SlotPlan(TAG)
    assert plan.cidr == "10.200.0.0/16"
    assert plan.capacity == 16384
    first = plan.slot(0)
    assert (str(first.network), first.host_ip, first.address) == ("10.200.0.0/30", "10.200.0.1", "10.200.0.2")
    assert (first.netns, first.host_veth, first.ns_veth, first.tap) == (
        "cryobox-0a1b2c-0",
        "cb0a1b2ch0",
        "eth0",
        "tap0",
    )
    last = plan.slot(16383)
    assert (str(last.network), last.host_ip, last.address) == ("10.200.255.252/30", "10.200.255.253", "10.200.255.254")
    assert last.host_veth == "cb0a1b2ch16383"
    for bad in (-1, 16384):
        with pytest.raises(InvalidArgument):
            plan.slot(bad)


def test_slots_are_disjoint_and_inside_the_plan() -> None:
    plan = SlotPlan(TAG, "10.23.4.0/24")
    assert plan.capacity == 64
    slots = [plan.slot(i) for i in range(plan.capacity)]
    nets = [s.network for s in slots]
    assert all(n.subnet_of(plan.network) for n in nets)
    assert len({n.network_address for n in nets}) == 64
    assert all(ipaddress.ip_address(s.address) in s.network for s in slots)


@pytest.mark.parametrize("cidr", ["10.0.0.0/8", "10.0.0.0/16", "10.0.0.0/30"])
def test_interface_names_fit_ifnamsiz(cidr: str) -> None:
    plan = SlotPlan("ffffff", cidr)
    last = plan.slot(plan.capacity - 1)
    assert len(last.host_veth) <= IFNAME_MAX
    assert plan.capacity <= MAX_SLOTS
    assert SlotPlan(TAG, "10.0.0.0/8").capacity == MAX_SLOTS  # names, not addresses, bound a huge CIDR
    assert SlotPlan(TAG, "10.0.0.0/30").capacity == 1


@pytest.mark.parametrize(
    "cidr", ["nope", "10.200.0.1/16", "fd00::/64", "10.0.0.0/31", "10.0.0.0/32", "10.0.0.0/33", ""]
)
def test_bad_cidrs_are_refused(cidr: str) -> None:
    with pytest.raises(InvalidArgument):
        SlotPlan(TAG, cidr)


@pytest.mark.parametrize("tag", ["", "abc", "ABCDEF", "abcdefa", "ghijkl"])
def test_bad_tags_are_refused(tag: str) -> None:
    with pytest.raises(InvalidArgument):
        SlotPlan(tag)


def test_tag_is_stable_and_per_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tag = tag_for(tmp_path / "a")
    assert re.fullmatch(r"[0-9a-f]{6}", tag)
    assert tag == tag_for(tmp_path / "a") == tag_for(tmp_path / "b" / ".." / "a")
    monkeypatch.chdir(tmp_path)
    assert tag_for(Path("a")) == tag
    assert tag_for(tmp_path / "b") != tag
    SlotPlan(tag)  # always a valid tag


def test_from_env() -> None:
    assert SlotPlan.from_env(TAG, env={}).cidr == "10.200.0.0/16"
    assert SlotPlan.from_env(TAG, env={"CRYOBOX_NET_CIDR": " 10.23.0.0/20 "}).capacity == 1024
    with pytest.raises(InvalidArgument):
        SlotPlan.from_env(TAG, env={"CRYOBOX_NET_CIDR": "10.23.0.0/31"})


def test_slot_netns_ruleset_nats_to_the_baked_guest() -> None:
    for mode in EGRESS_MODES:
        slot = SlotPlan(TAG, "10.23.0.0/16", egress=mode).slot(1)
        rules = slot_ruleset(slot)
        assert f'iifname "eth0" ip saddr 10.23.0.5 ip daddr 10.23.0.6 dnat ip to {GUEST_IP}' in rules
        assert f'oifname "eth0" ip saddr {GUEST_IP} snat ip to 10.23.0.6' in rules
        redirect = f'iifname "tap0" ip daddr != 172.16.0.1 meta l4proto tcp redirect to :{PROXY_PORT}'
        assert (redirect in rules) == (mode == "proxy")
        assert "type filter hook forward priority filter + 10; policy drop;" in rules
        assert rules.startswith("table inet cryobox\ndelete table inet cryobox\n")  # a reload replaces it whole
        queue = slot_queue_rules(slot)
        assert queue.startswith("*filter\n") and queue.endswith("COMMIT\n")
        assert ("NFQUEUE --queue-num 0 --queue-bypass" in queue) == (mode == "forward")
    assert in_netns(slot.netns, "nft", "-f", "-")[:2] == ["nsenter", "--net=/run/netns/cryobox-0a1b2c-1"]


def test_forward_mode_rules_read_the_gates_marks_deny_first_and_reset_what_nobody_decided() -> None:
    rules = slot_ruleset(SlotPlan(TAG, "10.23.0.0/16").slot(1))
    order = [
        f"ct mark {MARK_ALLOW:#x} accept",  # the bulk of the packets: out at once (a cut sets the deny mark)
        f"meta mark {MARK_PASS:#x} accept",
        f"meta mark {MARK_DENY:#x} ct mark set {MARK_DENY:#x} reject with tcp reset",
        f"ct mark {MARK_DENY:#x} reject with tcp reset",  # sticky: a later allow mark cannot lift it
        f"meta mark {MARK_ALLOW:#x} ct mark set {MARK_ALLOW:#x} accept",
        'iifname "tap0" meta l4proto tcp reject with tcp reset',
    ]
    at = [rules.index(rule) for rule in order]
    assert at == sorted(at)
    assert 'oifname "eth0" drop' in rules.split("chain output")[1]  # the namespace's own sockets go nowhere


# -- firewall against a fake nft ---------------------------------------------------------------------------------


def test_proxy_mode_firewall_routes_nothing(tmp_path: Path) -> None:
    nft = FakeNft()
    fw = Firewall(SlotPlan(TAG, "10.23.0.0/16", egress="proxy"), runner=nft, state_dir=tmp_path)
    fw.ensure()
    assert "masquerade" not in nft.scripts[-1] and " accept\n    iifname" not in nft.scripts[-1].split("forward {")[2]
    assert not was_file(tmp_path).exists()  # proxy mode never touches the host's routing


def test_forward_mode_turns_routing_on_only_when_off_and_back_with_the_last_table(tmp_path: Path) -> None:
    nft, ip_forward = FakeNft(), tmp_path / "ip_forward"
    ip_forward.write_text("0\n")
    floor: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [
        ipaddress.IPv4Network("10.0.0.0/8"),
        ipaddress.IPv4Network("10.1.0.0/16"),
        ipaddress.IPv6Network("fd00::/8"),
    ]
    fw = Firewall(SlotPlan(TAG, "10.23.0.0/16"), runner=nft, floor=floor, state_dir=tmp_path, ip_forward=ip_forward)
    fw.ensure()
    assert ip_forward.read_text() == "1" and was_file(tmp_path).read_text() == "0\n"
    script = nft.scripts[-1]
    assert 'iifname "cb0a1b2ch*" ip daddr { 10.0.0.0/8 } drop' in script  # the floor, collapsed, IPv4 only
    assert 'iifname != "cb*" oifname != "cb*" drop' in script  # the host routes nothing else it did not before
    fw.ensure()  # again (a restart): still knows it was off
    assert 'iifname != "cb*" oifname != "cb*" drop' in nft.scripts[-1]
    nft.tables = ["cryobox_ffffff"]  # another agent's table is still there: routing stays on
    fw.remove()
    assert ip_forward.read_text() == "1"
    nft.tables = []
    fw.remove()
    assert ip_forward.read_text() == "0" and not was_file(tmp_path).exists()
    ip_forward.write_text("1")  # a host that routed before: left as it is, and nothing else of it dropped
    fw.ensure()
    assert 'oifname != "cb*" drop' not in nft.scripts[-1] and not was_file(tmp_path).exists()


def test_the_table_of_a_dead_agent_removed_by_tag_gives_the_routing_back_with_the_last(tmp_path: Path) -> None:
    """What reclaims a killed agent's data dir (the suite's teardown, the restart bench) removes its table with
    ``remove_table``: a bare ``nft delete`` of the last table left the host routing (found when two workers'
    servers overlapped)."""
    nft, ip_forward = FakeNft(), tmp_path / "ip_forward"
    ip_forward.write_text("0\n")
    Firewall(SlotPlan(TAG, "10.23.0.0/16"), runner=nft, state_dir=tmp_path, ip_forward=ip_forward).ensure()
    assert ip_forward.read_text() == "1"
    nft.tables = ["cryobox_ffffff"]  # another agent's: routing stays on
    remove_table(TAG, runner=nft, state_dir=tmp_path, ip_forward=ip_forward)
    assert nft.scripts[-1] == f"add table inet cryobox_{TAG}\ndelete table inet cryobox_{TAG}\n"
    assert ip_forward.read_text() == "1" and was_file(tmp_path).exists()
    nft.tables = []
    remove_table("ffffff", runner=nft, state_dir=tmp_path, ip_forward=ip_forward)  # the last one
    assert ip_forward.read_text() == "0" and not was_file(tmp_path).exists()


def test_routing_records_of_namespaces_that_are_gone_are_pruned(tmp_path: Path) -> None:
    """An agent killed with its own network namespace leaves its routing record behind (found after a fleet bench):
    the next start or stop of any agent removes it, and only it."""
    proc, mounts, state = tmp_path / "proc", tmp_path / "netns", tmp_path / "state"
    for d in (proc / "42" / "ns", mounts, state):
        d.mkdir(parents=True)
    (proc / "42" / "ns" / "net").write_text("")  # a process's namespace (stand-ins: their files' inodes)
    (mounts / "cryobox-x").write_text("")  # a mounted one
    live = live_netns(proc, mounts)
    assert live == {os.stat(proc / "42" / "ns" / "net").st_ino, os.stat(mounts / "cryobox-x").st_ino}
    kept = [state / f"ip_forward.{inode}.was" for inode in live]
    stale = state / "ip_forward.1.was"
    for record in (*kept, stale):
        record.write_text("0\n")
    assert prune_records(state, live) == [stale]
    assert sorted(state.iterdir()) == sorted(kept)


def test_firewall_ensure_and_remove(tmp_path: Path) -> None:
    nft = FakeNft()
    ip_forward = tmp_path / "ip_forward"
    ip_forward.write_text("1")
    fw = Firewall(SlotPlan(TAG, "10.23.0.0/16"), runner=nft, state_dir=tmp_path, ip_forward=ip_forward)
    fw.ensure()
    script = nft.scripts[-1]
    assert script.startswith("table inet cryobox_0a1b2c {")
    for rule in (
        'iifname "cb0a1b2ch*" ct state established,related accept',
        'iifname "cb0a1b2ch*" drop',
        'oifname "cb0a1b2ch*" ct state established,related accept',
    ):
        assert rule in script
    assert "masquerade" in script and 'iifname "cb0a1b2ch*" ip saddr 10.23.0.0/16 meta l4proto tcp accept' in script
    assert 'iifname "cb0a1b2ch*" oifname "cb*" drop' in script  # never slot to slot, of any agent
    fw.ensure(fresh=True)
    assert nft.scripts[-1].startswith("add table inet cryobox_0a1b2c\ndelete table inet cryobox_0a1b2c\n")
    fw.remove()
    assert nft.scripts[-1] == "add table inet cryobox_0a1b2c\ndelete table inet cryobox_0a1b2c\n"


def test_parse_cidrs_normalizes() -> None:
    assert [str(n) for n in parse_cidrs(["1.2.3.4", " 10.0.0.0/8"])] == ["1.2.3.4/32", "10.0.0.0/8"]
    for bad in (["nope"], ["10.0.0.1/8"], ["fd00::/8"], [""], [42], "10.0.0.0/8"):
        with pytest.raises(InvalidArgument):
            parse_cidrs(bad)


# -- pool with a fake builder ------------------------------------------------------------------------------------


PLAN = SlotPlan(TAG, "10.23.0.0/16")


async def test_warm_acquire_is_a_pop_and_never_waits_for_a_build() -> None:
    builder = FakeBuilder()
    async with SlotPool(PLAN, size=4, builder=builder) as pool:
        await pool.wait_warm()
        assert sorted(builder.created) == [0, 1, 2, 3]
        builder.gate.clear()  # from now on every build hangs
        slots = [await asyncio.wait_for(pool.acquire(), 1) for _ in range(4)]
        assert [s.index for s in slots] == [0, 1, 2, 3]
        stats = pool.stats()
        assert (stats.warm_acquires, stats.cold_acquires, stats.idle, stats.leased) == (4, 0, 0, 4)
        assert stats.max_acquire_s < 0.5 and stats.mean_acquire_s <= stats.max_acquire_s
        cold = asyncio.ensure_future(pool.acquire())  # drained: must build inline
        await asyncio.sleep(0.05)
        assert not cold.done()
        builder.gate.set()
        slot = await asyncio.wait_for(cold, 5)
        assert slot.index >= 4 and pool.stats().cold_acquires == 1
        for s in [*slots, slot]:
            await pool.release(s)
    assert builder.live == set()
    assert sorted(builder.created) == sorted(builder.destroyed)


async def test_release_recycles() -> None:
    builder = FakeBuilder()
    async with SlotPool(PLAN, size=1, builder=builder) as pool:
        await pool.wait_warm()
        slot = await pool.acquire()
        await pool.wait_warm()  # the filler replaced it
        await pool.release(slot)
        assert builder.destroyed == []
        assert pool.stats().recycled == 1 and pool.stats().idle == 2
        again = [await pool.acquire(), await pool.acquire()]
        assert slot in again  # the same netns/veth/tap, not a rebuilt one
        assert builder.created.count(0) == 1
        with pytest.raises(StateError):
            await pool.release(PLAN.slot(9))
        for s in again:
            await pool.release(s)


async def test_beyond_the_cap_slots_are_destroyed_and_lowest_index_is_reused() -> None:
    builder = FakeBuilder()
    async with SlotPool(PLAN, size=0, builder=builder, max_idle=0) as pool:
        a, b, c = [await pool.acquire() for _ in range(3)]
        assert [a.index, b.index, c.index] == [0, 1, 2]
        await pool.release(c)
        await pool.release(a)
        assert builder.destroyed == [2, 0]
        d, e, f = [await pool.acquire() for _ in range(3)]
        assert [d.index, e.index, f.index] == [0, 2, 3]  # lowest free first
        assert pool.stats().cold_acquires == 6
        for s in (b, d, e, f):
            await pool.release(s)


async def test_close_destroys_everything() -> None:
    builder = FakeBuilder()
    pool = SlotPool(PLAN, size=3, builder=builder)
    await pool.wait_warm()
    leased = [await pool.acquire() for _ in range(5)]
    released = leased.pop()
    await pool.release(released)
    await pool.close()
    assert builder.live == set()
    assert sorted(builder.destroyed) == sorted(builder.created)
    with pytest.raises(StateError):
        await pool.acquire()
    await pool.close()  # idempotent


async def test_capacity_exhaustion_and_build_failure() -> None:
    builder = FakeBuilder()
    async with SlotPool(SlotPlan(TAG, "10.23.0.0/28"), size=0, builder=builder) as pool:
        builder.fail_next = True
        with pytest.raises(OSError):
            await pool.acquire()
        slots = [await pool.acquire() for _ in range(4)]
        assert [s.index for s in slots] == [0, 1, 2, 3]  # the failed build gave its index back
        with pytest.raises(HostUnavailable):
            await pool.acquire()
        await pool.release(slots[2])
        assert (await pool.acquire()).index == 2


async def test_random_churn_never_shares_an_index() -> None:
    import random

    rng = random.Random(7)
    builder = FakeBuilder()
    async with SlotPool(PLAN, size=3, builder=builder, max_idle=5) as pool:
        leased: list[Slot] = []
        for _ in range(300):
            if leased and rng.random() < 0.5:
                await pool.release(leased.pop(rng.randrange(len(leased))))
            else:
                leased.append(await pool.acquire())
            assert len({s.index for s in leased}) == len(leased)
            if rng.random() < 0.2:
                await asyncio.sleep(0)
    assert builder.live == set()


def test_index_allocator() -> None:
    alloc = IndexAllocator(3)
    assert [alloc.take(), alloc.take(), alloc.take()] == [0, 1, 2]
    with pytest.raises(HostUnavailable):
        alloc.take()
    alloc.give(2)
    alloc.give(0)
    assert alloc.take() == 0
    with pytest.raises(StateError):
        alloc.give(2)
    assert alloc.live == 2


def test_the_rules_digest_tells_whether_a_slot_needs_its_rules_again() -> None:
    """An adopting agent reloads an adopted slot's nft rules only when the digest its record keeps differs from the
    rules it would load (an nsenter and an nft per sandbox were most of adopting 50)."""
    one, two = PLAN.slot(1), PLAN.slot(2)
    assert slot_rules_digest(one) == slot_rules_digest(PLAN.slot(1))  # the same rules, the same digest
    assert slot_rules_digest(one) != slot_rules_digest(two)  # another slot's addresses
    other_plan = SlotPlan(TAG, "10.24.0.0/16").slot(1)
    assert slot_rules_digest(one) != slot_rules_digest(other_plan)
    rules = slot_ruleset(one) + slot_queue_rules(one)
    assert slot_rules_digest(one) == hashlib.sha256(rules.encode()).hexdigest()[:16]
    assert slot_rules_digest(one) != slot_rules_digest(SlotPlan(TAG, PLAN.cidr, egress="proxy").slot(1))
