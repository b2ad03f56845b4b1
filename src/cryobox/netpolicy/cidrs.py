"""Egress policy values, validated the same way by the control plane (at the API) and the host agent (in its
firewall): what a tenant may ask for, independent of how a host enforces it."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ..errors import InvalidArgument


def parse_cidrs(cidrs: Iterable[object]) -> list[ipaddress.IPv4Network]:
    """Validate egress destinations: IPv4 networks without host bits (``10.0.0.1/24`` is refused as ambiguous)."""
    if isinstance(cidrs, str | bytes):
        raise InvalidArgument("cidrs must be a list of strings, not a single string", details={"cidrs": cidrs})
    nets: list[ipaddress.IPv4Network] = []
    for cidr in cidrs:
        if not isinstance(cidr, str):
            raise InvalidArgument(f"egress cidr must be a string, got {cidr!r}", details={"cidr": repr(cidr)})
        try:
            net = ipaddress.ip_network(cidr.strip(), strict=True)
        except ValueError as exc:
            raise InvalidArgument(f"bad egress cidr {cidr!r}: {exc}", details={"cidr": cidr}) from exc
        if not isinstance(net, ipaddress.IPv4Network):
            raise InvalidArgument(f"egress cidr must be IPv4, got {cidr!r}", details={"cidr": cidr})
        nets.append(net)
    return nets
