"""Destinations no guest may reach, whatever its network policy: judged before any tenant allow rule.

The default set is every range that is not the public internet — this-network, loopback, link-local (the
cloud metadata service at ``169.254.169.254``), RFC 1918, CGNAT (RFC 6598), benchmarking, IETF protocol
assignments, multicast and reserved space — plus the host's own networks (its routing table) and the
control plane's dependencies (the object store's and the database's addresses). Only the operator can
carve exceptions (``CRYOBOX_EGRESS_ALLOW_PRIVATE=10.199.0.0/16,...``): a tenant's policy allowing
``0.0.0.0/0`` still cannot reach any of it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from ...netpolicy import parse_cidrs

ENV_EXCEPTIONS = "CRYOBOX_EGRESS_ALLOW_PRIVATE"
DEFAULT_DENY = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)


def endpoint_networks(urls: Iterable[str | None]) -> list[ipaddress.IPv4Network]:
    """The IPv4 addresses of the hosts named in ``urls`` (store, database), as /32s. Unix sockets, files and
    unresolvable names add nothing."""
    found: list[ipaddress.IPv4Network] = []
    for url in urls:
        if not url:
            continue
        host = urlsplit(url).hostname
        if not host:
            continue
        try:
            found.append(ipaddress.IPv4Network(host))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        except OSError:
            continue
        found += [ipaddress.IPv4Network(str(info[4][0])) for info in infos]
    return found


def exceptions_from_env(env: Mapping[str, str] | None = None) -> list[ipaddress.IPv4Network]:
    raw = (os.environ if env is None else env).get(ENV_EXCEPTIONS, "").strip()
    return parse_cidrs([c for c in raw.split(",") if c.strip()]) if raw else []


def deny_networks(
    extra: Iterable[ipaddress.IPv4Network] = (), exceptions: Iterable[ipaddress.IPv4Network] = ()
) -> list[ipaddress.IPv4Network]:
    """The collapsed deny set: the defaults and ``extra``, minus the operator's ``exceptions``."""
    nets = list(ipaddress.collapse_addresses([*DEFAULT_DENY, *extra]))
    for hole in exceptions:
        carved: list[ipaddress.IPv4Network] = []
        for net in nets:
            if hole.subnet_of(net):
                carved += net.address_exclude(hole)
            elif not net.subnet_of(hole):
                carved.append(net)
        nets = list(ipaddress.collapse_addresses(carved))
    return nets
