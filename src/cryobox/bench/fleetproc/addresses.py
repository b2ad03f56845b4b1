"""Names and addresses of the fleet's agent namespaces (pure: no processes, no namespaces; unit-tested).

Agent ``k`` gets namespace ``cbxfleet-<name>-<hex>`` and a veth pair ``fl<hex>r`` (root namespace,
``10.250.<i>.1/30``) / ``fl<hex>a`` (agent namespace, ``10.250.<i>.2/30``), ``i`` being the first index whose /24
no address or route of the root namespace touches (see :class:`.netns.AgentNetns`, which allocates it under a lock
file, so concurrent fleets on the machine never collide). The agent listens on ``10.250.<i>.2:AGENT_PORT`` and
advertises that URL: the control plane (root namespace) calls it over the veth.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from ...agent.net.slots import pick_cidr

FLEET_NET = ipaddress.IPv4Network("10.250.0.0/16")
NETNS_PREFIX = "cbxfleet-"
LINK_PREFIX = "fl"
AGENT_PORT = 7480
"""The port every namespaced agent listens on (each namespace has its own address, so one port serves all)."""
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})


@dataclass(frozen=True)
class NetnsAddresses:
    """The /30 of fleet index ``index`` (1..254): ``.1`` on the root end of the veth, ``.2`` in the namespace."""

    index: int
    network: ipaddress.IPv4Network
    root_ip: str
    agent_ip: str

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen


def fleet_addresses(index: int) -> NetnsAddresses:
    if not 1 <= index <= 254:
        raise ValueError(f"fleet index must be in 1..254, got {index}")
    network = ipaddress.IPv4Network(f"10.250.{index}.0/30")
    return NetnsAddresses(index, network, str(network.network_address + 1), str(network.network_address + 2))


def pick_fleet_index(used: Iterable[ipaddress.IPv4Network], exclude: Collection[int] = ()) -> int:
    """The first index whose ``10.250.<i>.0/24`` overlaps none of ``used`` (the root namespace's addresses and
    routes; a default route is not an overlap)."""
    taken = [net for net in used if net.prefixlen > 0]
    for index in range(1, 255):
        block = ipaddress.IPv4Network(f"10.250.{index}.0/24")
        if index not in exclude and not any(block.overlaps(net) for net in taken):
            return index
    raise RuntimeError("no free 10.250.<i>.0/24 for a fleet namespace")


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"agent name must match {_NAME_RE.pattern}, got {name!r}")
    return name


def netns_name(name: str, hex_id: str) -> str:
    return f"{NETNS_PREFIX}{check_name(name)}-{hex_id}"


def parse_netns_name(name: str) -> tuple[str, str] | None:
    """``cbxfleet-<name>-<hex6>`` -> (name, hex6); ``None`` for any other name."""
    match = re.fullmatch(rf"{NETNS_PREFIX}([a-z0-9][a-z0-9-]{{0,19}})-([0-9a-f]{{6}})", name)
    return (match.group(1), match.group(2)) if match else None


def link_names(hex_id: str) -> tuple[str, str]:
    """(root end, agent end): ``fl<hex6>r`` / ``fl<hex6>a``, 9 bytes (IFNAMSIZ allows 15). Not ``cb*``: agents
    treat ``cb*`` links as their sandboxes' slots."""
    return f"{LINK_PREFIX}{hex_id}r", f"{LINK_PREFIX}{hex_id}a"


def loopback_ports(urls: Iterable[str]) -> list[int]:
    """Ports of the loopback endpoints among ``urls`` (``http://127.0.0.1:P``, or an ``s3://…?endpoint=`` one):
    what a namespaced agent needs relayed to the root namespace. Sorted, without duplicates."""
    ports: set[int] = set()
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme == "s3":
            endpoint = parse_qs(parts.query).get("endpoint", [""])[0]
            if not endpoint:
                continue
            parts = urlsplit(endpoint)
        if parts.hostname in _LOOPBACK_HOSTS:
            ports.add(parts.port or (443 if parts.scheme == "https" else 80))
    return sorted(ports)


def slot_cidrs(count: int, taken: Iterable[ipaddress.IPv4Network] = ()) -> list[str]:
    """``count`` distinct ``10.N.0.0/16`` slot CIDRs (``CRYOBOX_NET_CIDR`` of each agent), overlapping none of
    ``taken`` nor the fleet's own 10.250.0.0/16."""
    used = [*taken, FLEET_NET]
    out = []
    for _ in range(count):
        cidr = pick_cidr(used)
        out.append(cidr)
        used.append(ipaddress.IPv4Network(cidr))
    return out
