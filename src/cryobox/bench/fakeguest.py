"""A stand-in guest for a network slot, without a VM: what ``cryobox bench net`` measures the egress path with and
what the network tests drive the slots through (``tests/support/netutil.py`` uses this one)."""

from __future__ import annotations

import os
from collections.abc import Callable

from pyroute2 import IPRoute, netns

from ..agent.net import GATEWAY_IP, GATEWAY_MAC, GUEST_IP, GUEST_MAC, Slot
from ..agent.net.slots import NETNS_DIR
from ..util.system import in_fresh_thread


def _in_ns(name: str, fn: Callable[[], None]) -> None:
    def inside() -> None:
        fd = os.open(NETNS_DIR / name, os.O_RDONLY)
        try:
            netns.setns(fd, flags=0)
        finally:
            os.close(fd)
        fn()

    in_fresh_thread(inside, name="cryobox-fake-guest")


def attach_fake_guest(slot: Slot) -> str:
    """Replace ``slot``'s tap0 with a veth whose peer is a guest netns carrying the baked guest identity: from the
    slot's side indistinguishable from QEMU's guest, so the slot's rules and the egress proxy work as for a VM."""

    guest = f"{slot.netns}g"  # tagged: reclaim(tag) removes it too
    netns.create(guest)
    fd = os.open(NETNS_DIR / guest, os.O_RDONLY)
    try:

        def slot_side() -> None:
            with IPRoute() as ipr:
                ipr.link("del", index=ipr.link_lookup(ifname=slot.tap)[0])
                ipr.link("add", ifname=slot.tap, kind="veth", peer={"ifname": "eth0", "net_ns_fd": fd})
                idx = ipr.link_lookup(ifname=slot.tap)[0]
                ipr.link("set", index=idx, address=GATEWAY_MAC, state="up")
                ipr.addr("add", index=idx, address=GATEWAY_IP, prefixlen=30)

        _in_ns(slot.netns, slot_side)
    finally:
        os.close(fd)

    def guest_side() -> None:
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            idx = ipr.link_lookup(ifname="eth0")[0]
            ipr.link("set", index=idx, address=GUEST_MAC, state="up")
            ipr.addr("add", index=idx, address=GUEST_IP, prefixlen=30)
            ipr.route("add", dst="0.0.0.0/0", gateway=GATEWAY_IP)

    _in_ns(guest, guest_side)
    return guest
