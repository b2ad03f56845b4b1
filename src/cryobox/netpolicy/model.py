"""The policy value: default allow or deny, allow and deny lists of IPv4 networks and host names, the
destination ports egress may use, and who may reach the guest's ports from outside.

Rules are kept as given, normalized (``1.2.3.4`` becomes ``1.2.3.4/32``, names lowercase ASCII), and sorted into
``allow_cidrs``/``allow_names``/``deny_cidrs``/``deny_names`` once. IPv6 networks may be *denied* (IPv6 is never
routed for guests, so that holds trivially) but never allowed: that could not be enforced.
"""

from __future__ import annotations

import ipaddress
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import InvalidArgument
from .names import normalize_name

MAX_RULES = 512
MAX_PORTS = 64
MASK_MAX = 253


def _rule(raw: object, *, allow: bool) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"a rule must be a non-empty string, got {raw!r}")
    text = raw.strip()
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as err:
        if "/" in text or text.replace(".", "").isdigit() or ":" in text:
            raise ValueError(f"bad network {text!r}: {err}") from err
        try:
            return normalize_name(text)
        except InvalidArgument as bad:
            raise ValueError(bad.message) from bad
    if isinstance(net, ipaddress.IPv6Network):
        if allow:
            raise ValueError(f"{text!r}: IPv6 egress is not routed for guests, so it cannot be allowed")
        return str(net)
    return str(net)


class EgressPolicy(BaseModel):
    """One sandbox's network policy (``/v1`` ``network``; E2B's ``network`` and ``allow_internet_access`` map to
    it). Immutable: an update replaces the whole value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: Literal["allow", "deny"] = "deny"
    """What a connection no rule matches gets."""
    allow: list[str] = Field(default_factory=list, max_length=MAX_RULES)
    """IPv4 networks (``203.0.113.0/24``, ``198.51.100.7``) and host names (``example.org``, ``*.example.org``)."""
    deny: list[str] = Field(default_factory=list, max_length=MAX_RULES)
    """Same shapes as ``allow``; where an allow and a deny rule both match, deny wins."""
    ports: list[int] = Field(default_factory=list, max_length=MAX_PORTS)
    """Destination ports egress may use (empty: any)."""
    public_traffic: bool = True
    """Whether the guest's ports are reachable through the port proxy without the sandbox's traffic token."""
    mask_request_host: str | None = Field(default=None, max_length=MASK_MAX)
    """The ``Host`` the port proxy sends to the guest (``${PORT}`` is the port), instead of the caller's."""

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: Any) -> Any:
        return _rules(value, allow=True)

    @field_validator("deny", mode="before")
    @classmethod
    def _deny(cls, value: Any) -> Any:
        return _rules(value, allow=False)

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        for port in value:
            if not 1 <= port <= 65535:
                raise ValueError(f"port {port} is not 1-65535")
        return sorted(set(value))

    @field_validator("mask_request_host")
    @classmethod
    def _mask(cls, value: str | None) -> str | None:
        if value is None:
            return None
        probe = value.replace("${PORT}", "1")
        if not probe or any(c in probe for c in " /\\?#@\r\n\t") or not probe.isascii():
            raise ValueError(f"mask_request_host {value!r} is not a host (with an optional ${{PORT}})")
        return value

    @cached_property
    def allow_cidrs(self) -> tuple[ipaddress.IPv4Network, ...]:
        return _cidrs(self.allow)

    @cached_property
    def deny_cidrs(self) -> tuple[ipaddress.IPv4Network, ...]:
        return _cidrs(self.deny)

    @cached_property
    def allow_names(self) -> tuple[str, ...]:
        return tuple(r for r in self.allow if not _is_network(r))

    @cached_property
    def deny_names(self) -> tuple[str, ...]:
        return tuple(r for r in self.deny if not _is_network(r))

    @property
    def has_names(self) -> bool:
        """Whether any rule is a name: then the proxy must read each connection's name before deciding."""
        return bool(self.allow_names or self.deny_names)

    @property
    def closed(self) -> bool:
        """Nothing can ever be allowed (default deny, no allow rule)."""
        return self.default == "deny" and not self.allow

    def request_host(self, port: int) -> str | None:
        """The ``Host`` the port proxy sends to the guest's port ``port``: ``mask_request_host`` with ``${PORT}``
        replaced; ``None`` (the upstream's own address) when the policy masks nothing."""
        return self.mask_request_host.replace("${PORT}", str(port)) if self.mask_request_host is not None else None

    @classmethod
    def parse(cls, value: Any, *, field: str = "network") -> EgressPolicy:
        """Validate a request value. :raises InvalidArgument: naming the field and what is wrong with it."""
        from pydantic import ValidationError

        try:
            return cls.model_validate(value)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in (field, *first["loc"]))
            message = str(first.get("ctx", {}).get("error", first["msg"]))
            raise InvalidArgument(f"{where}: {message}", details={"field": where}) from err


def _rules(value: Any, *, allow: bool) -> Any:
    if isinstance(value, str | bytes):
        raise ValueError("must be a list of strings, not a single string")
    if not isinstance(value, list | tuple):
        return value
    out: list[str] = []
    for raw in value:
        rule = _rule(raw, allow=allow)
        if rule not in out:
            out.append(rule)
    return out


def _is_network(rule: str) -> bool:
    return rule[:1].isdigit() or ":" in rule


def _cidrs(rules: list[str]) -> tuple[ipaddress.IPv4Network, ...]:
    nets = [ipaddress.ip_network(r) for r in rules if _is_network(r)]
    return tuple(n for n in nets if isinstance(n, ipaddress.IPv4Network))


def legacy_policy(value: Any) -> Any:
    """A stored egress value of before policies (a list of CIDRs the guest may reach) as a policy mapping;
    ``None`` (egress denied) and policy mappings pass unchanged."""
    if isinstance(value, list):
        return {"default": "deny", "allow": value}
    return value


__all__ = ["MAX_PORTS", "MAX_RULES", "EgressPolicy", "legacy_policy"]
