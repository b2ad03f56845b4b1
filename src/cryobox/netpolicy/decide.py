"""How a policy judges one connection: by the name it carried (TLS SNI or HTTP ``Host``, when it carried one)
and the address it is about to reach. The operator's floor comes first and no rule opens it; then ports; then
deny rules, which win over allow rules; then allow rules; then the default.

A connection without a name is judged by its address alone, so a name rule never opens that name's addresses to
raw-address connections. A connection with a name is judged by the name *and* by each address the proxy resolved
for it, never by the address the guest chose.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from .model import EgressPolicy
from .names import matches_name

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    """``floor``, ``port``, ``deny-name``, ``deny-cidr``, ``allow-name``, ``allow-cidr``, ``default``."""


def _in(ip: ipaddress.IPv4Address, nets: Sequence[Network]) -> bool:
    return any(ip in net for net in nets)


def decide(
    policy: EgressPolicy,
    *,
    name: str | None,
    ip: ipaddress.IPv4Address,
    port: int,
    floor: Sequence[Network] = (),
) -> Verdict:
    """Whether a connection to ``ip``:``port`` (carrying ``name``, normalized, or none) may go out."""
    if _in(ip, floor):
        return Verdict(False, "floor")
    if policy.ports and port not in policy.ports:
        return Verdict(False, "port")
    if name is not None and any(matches_name(p, name) for p in policy.deny_names):
        return Verdict(False, "deny-name")
    if _in(ip, policy.deny_cidrs):
        return Verdict(False, "deny-cidr")
    if name is not None and any(matches_name(p, name) for p in policy.allow_names):
        return Verdict(True, "allow-name")
    if _in(ip, policy.allow_cidrs):
        return Verdict(True, "allow-cidr")
    return Verdict(policy.default == "allow", "default")


def name_resolves(policy: EgressPolicy, name: str) -> bool:
    """Whether the guest's resolver answers ``name``: never a denied name; an allowed name; any other name only
    when something could still be reached by it (default allow, or an allowed network its address may be in)."""
    if any(matches_name(p, name) for p in policy.deny_names):
        return False
    if any(matches_name(p, name) for p in policy.allow_names):
        return True
    return policy.default == "allow" or bool(policy.allow_cidrs)


__all__ = ["Verdict", "decide", "name_resolves"]
