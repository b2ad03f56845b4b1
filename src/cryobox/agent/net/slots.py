"""Network slots: pure arithmetic from an index.

Every guest is baked with the same network identity (``GUEST_IP``, ``GATEWAY_IP``, ``GUEST_MAC``) so a snapshot
restores into any slot unchanged: the guest never learns which slot it landed in. What differs per slot is only
the host side: a network namespace holding the guest's tap, and a veth pair linking that namespace to the host.
Inside the namespace, the slot's ``address`` is DNAT'ed to ``GUEST_IP`` and the guest's traffic is SNAT'ed back
to ``address``, so from the host every guest looks like a distinct IP while every guest sees the same one.

A slot is derived from ``(plan, index)`` alone: the index picks the index-th /30 of the plan's CIDR, and all
names embed the plan's tag (derived from the data dir), so two agents with different data dirs on one host never
touch each other's namespaces, links or firewall tables, and a restarted agent can find its predecessor's
leftovers by tag.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from cryobox.errors import InvalidArgument

GUEST_IP = "172.16.0.2"
GATEWAY_IP = "172.16.0.1"
GUEST_PREFIXLEN = 30
GUEST_MAC = "02:cb:00:00:00:02"
# The tap's MAC. Fixed so the ARP entry a guest cached for its gateway before a snapshot stays valid in any slot.
GATEWAY_MAC = "02:cb:00:00:00:01"

PROXY_PORT = 15001
"""Where the slot's nft ``redirect`` sends the guest's TCP: the egress proxy's listener on ``GATEWAY_IP`` inside
the slot's namespace."""

EgressMode = Literal["forward", "proxy"]
EGRESS_MODE_ENV = "CRYOBOX_EGRESS_MODE"
"""How a guest's TCP leaves (:mod:`.egress`): ``forward`` (the default) — the kernel forwards every connection once
the egress gate has decided it from its first packets; ``proxy`` — every connection ends at the egress proxy,
which opens its own towards the address it resolved, and the host never routes a guest's packet."""
EGRESS_MODES: tuple[EgressMode, ...] = ("forward", "proxy")
MARK_ALLOW = 0xCB01
MARK_DENY = 0xCB02
MARK_PASS = 0xCB03
"""``forward`` mode: the packet marks of the egress gate's verdicts, which the slot's rules read: allowed (copied to
the connection), denied (copied, sticky, answered with a reset), and let through undecided (the handshake; not
copied, so the connection's next packet is queued again)."""
DEFAULT_CIDR = "10.200.0.0/16"
CIDR_ENV = "CRYOBOX_NET_CIDR"
NETNS_DIR = Path("/run/netns")
NS_VETH = "eth0"
TAP = "tap0"
NETNS_PREFIX = "cryobox-"
LINK_PREFIX = "cb"
# Linux interface names are at most IFNAMSIZ - 1 = 15 bytes.
IFNAME_MAX = 15
# "cb" + 6-hex tag + "h" + 5-digit index = 14 <= 15: that is what bounds the index, not the CIDR.
MAX_SLOTS = 100_000  # indices 0..99999: at most 5 digits
_TAG_RE = re.compile(r"^[0-9a-f]{6}$")
_SLOT_PREFIX = 30


def pick_cidr(taken: Iterable[ipaddress.IPv4Network]) -> str:
    """The first ``10.N.0.0/16`` (N = 200..254) overlapping none of ``taken``."""
    used = list(taken)
    for second in range(200, 255):
        candidate = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        if not any(candidate.overlaps(net) for net in used):
            return str(candidate)
    raise InvalidArgument("no free 10.N.0.0/16 for network slots; set CRYOBOX_NET_CIDR", details={"env": CIDR_ENV})


def egress_mode_from_env(env: Mapping[str, str] | None = None) -> EgressMode:
    """``CRYOBOX_EGRESS_MODE`` (unset: ``forward``); an unknown value is refused when the plan is made."""
    source = os.environ if env is None else env
    return cast(EgressMode, source.get(EGRESS_MODE_ENV, "").strip().lower() or "forward")


def tag_for(data_dir: Path) -> str:
    """Six hex chars naming this data dir's network objects; stable across restarts of the same data dir."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:6]


def check_tag(tag: str) -> str:
    """Tags are exactly 6 lowercase hex chars: the interface-name budget and prefix matching both rely on it."""
    if not _TAG_RE.match(tag):
        raise InvalidArgument(f"network tag must be 6 lowercase hex characters, got {tag!r}", details={"tag": tag})
    return tag


def netns_prefix(tag: str) -> str:
    """Prefix of every netns name carrying ``tag``."""
    return f"{NETNS_PREFIX}{tag}-"


def link_prefix(tag: str) -> str:
    """Prefix of every host-side link name carrying ``tag`` (also the nft wildcard ``cb<tag>h*``)."""
    return f"{LINK_PREFIX}{tag}h"


@dataclass(frozen=True)
class Slot:
    """One slot: a /30 whose .1 is the host end of the veth and whose .2 is the netns end.

    ``address`` is what the host dials to reach the guest (DNAT'ed to ``GUEST_IP`` inside ``netns``); it is also
    the source the outside world sees for the guest's egress before host masquerading.
    """

    index: int
    tag: str
    network: ipaddress.IPv4Network
    host_ip: str
    address: str
    netns: str
    host_veth: str
    ns_veth: str = NS_VETH
    tap: str = TAP
    egress: EgressMode = "forward"

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns


@dataclass(frozen=True)
class SlotPlan:
    """The CIDR slots are carved from, and the tag naming them. ``capacity`` = number of /30s in the CIDR."""

    tag: str
    cidr: str = DEFAULT_CIDR
    egress: EgressMode = "forward"

    def __post_init__(self) -> None:
        check_tag(self.tag)
        if self.egress not in EGRESS_MODES:
            raise InvalidArgument(
                f"{EGRESS_MODE_ENV} must be one of {', '.join(EGRESS_MODES)}, got {self.egress!r}",
                details={"env": EGRESS_MODE_ENV, "value": self.egress},
            )
        try:
            net = ipaddress.ip_network(self.cidr, strict=True)
        except ValueError as exc:
            raise InvalidArgument(f"bad slot CIDR {self.cidr!r}: {exc}", details={"cidr": self.cidr}) from exc
        if not isinstance(net, ipaddress.IPv4Network):
            raise InvalidArgument(f"slot CIDR must be IPv4, got {self.cidr!r}", details={"cidr": self.cidr})
        if net.prefixlen > _SLOT_PREFIX:
            raise InvalidArgument(
                f"slot CIDR {self.cidr!r} is smaller than one /30", details={"cidr": self.cidr, "max_prefix": 30}
            )

    @classmethod
    def from_env(
        cls, tag: str, env: Mapping[str, str] | None = None, taken: Iterable[ipaddress.IPv4Network] = ()
    ) -> SlotPlan:
        """Plan from ``CRYOBOX_NET_CIDR``; unset, the first of ``10.200.0.0/16``, ``10.201.0.0/16``, ... that
        overlaps none of the ``taken`` networks (the host's routes: a LAN, or another cryobox on this host)."""
        source = os.environ if env is None else env
        explicit = source.get(CIDR_ENV, "").strip()
        return cls(tag=tag, cidr=explicit or pick_cidr(taken), egress=egress_mode_from_env(source))

    @property
    def network(self) -> ipaddress.IPv4Network:
        net = ipaddress.ip_network(self.cidr)
        assert isinstance(net, ipaddress.IPv4Network)
        return net

    @property
    def capacity(self) -> int:
        """Usable slots: /30s in the CIDR, capped by the 5-digit index budget of interface names."""
        return min(1 << (_SLOT_PREFIX - self.network.prefixlen), MAX_SLOTS)

    def slot(self, index: int) -> Slot:
        if not 0 <= index < self.capacity:
            raise InvalidArgument(
                f"slot index {index} out of range [0, {self.capacity})",
                details={"index": index, "capacity": self.capacity},
            )
        base = int(self.network.network_address) + 4 * index
        network = ipaddress.IPv4Network((base, _SLOT_PREFIX))
        host_veth = f"{link_prefix(self.tag)}{index}"
        assert len(host_veth) <= IFNAME_MAX, host_veth
        return Slot(
            index=index,
            tag=self.tag,
            network=network,
            host_ip=str(ipaddress.IPv4Address(base + 1)),
            address=str(ipaddress.IPv4Address(base + 2)),
            netns=f"{netns_prefix(self.tag)}{index}",
            host_veth=host_veth,
            egress=self.egress,
        )
