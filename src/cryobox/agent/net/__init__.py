"""Per-sandbox network slots (host side): one netns + veth + tap per guest, one host nft table per agent.

* :mod:`.slots` — pure arithmetic: index -> addresses and names (no I/O, no root).
* :mod:`.netlink` — build/destroy/reclaim slots with pyroute2 (root).
* :mod:`.firewall` — the host nft table: guests reach neither the host nor each other, nor route through it.
* :mod:`.egress` — what a guest may reach: the proxy its TCP is redirected to, its name server, per policy.
* :mod:`.pool` — keeps slots pre-built so acquiring one is a deque pop.

``netlink`` and ``firewall`` are imported lazily (PEP 562 ``__getattr__``) so pure code and unit tests can use
``slots`` and ``pool`` without pyroute2's import cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .pool import IndexAllocator, PoolStats, SlotBuilder, SlotPool
from .slots import CIDR_ENV, DEFAULT_CIDR, GATEWAY_IP, GATEWAY_MAC, GUEST_IP, GUEST_MAC, Slot, SlotPlan, tag_for

if TYPE_CHECKING:
    from .firewall import Firewall
    from .netlink import (
        NetlinkBuilder,
        NetworkSetupError,
        Reclaimed,
        Tagged,
        create_slot,
        destroy_slot,
        list_tagged,
        reclaim,
    )

_LAZY = {
    "Firewall": "firewall",
    "NetlinkBuilder": "netlink",
    "NetworkSetupError": "netlink",
    "Reclaimed": "netlink",
    "Tagged": "netlink",
    "create_slot": "netlink",
    "destroy_slot": "netlink",
    "list_tagged": "netlink",
    "reclaim": "netlink",
}

__all__ = [
    "CIDR_ENV",
    "DEFAULT_CIDR",
    "GATEWAY_IP",
    "GATEWAY_MAC",
    "GUEST_IP",
    "GUEST_MAC",
    "Firewall",
    "IndexAllocator",
    "NetlinkBuilder",
    "NetworkSetupError",
    "PoolStats",
    "Reclaimed",
    "Slot",
    "SlotBuilder",
    "SlotPlan",
    "SlotPool",
    "Tagged",
    "create_slot",
    "destroy_slot",
    "list_tagged",
    "reclaim",
    "tag_for",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
