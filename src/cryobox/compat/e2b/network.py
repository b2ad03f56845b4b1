"""E2B's network options onto cryobox's policy (:class:`~cryobox.netpolicy.EgressPolicy`), both ways.

Create (``allow_internet_access`` and ``network``: ``allowOut``, ``denyOut``, ``allowPublicTraffic``,
``maskRequestHost``) and ``PUT /sandboxes/{id}/network`` (``allowOut``, ``denyOut``, ``allow_internet_access``):

- ``denyOut`` holding ``0.0.0.0/0``, or ``allow_internet_access: false``: default deny; the other ``denyOut``
  entries are deny rules, ``allowOut`` entries allow rules;
- ``allow_internet_access: true``: default allow; saying nothing about the internet: the operator's
  ``CRYOBOX_E2B_INTERNET`` (``allow``, E2B's own default, or ``deny``).
- Where an allow and a deny rule both match, cryobox denies (E2B lets the allow rule win): ``allowOut:
  ["1.2.3.4"], denyOut: ["1.2.3.0/24"]`` reaches 1.2.3.4 on E2B, not here. The usual shape (deny all, allow
  some) is the same on both. cryobox also takes host names in ``denyOut`` (E2B refuses them).

What cryobox does not enforce is a 400 naming the field: ``network.rules`` (request transforms),
``network.egressProxy``, ``network.dnsServers``, ``network.httpsPorts`` and any key it does not know; values that
ask for nothing (null, empty) pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ...errors import InvalidArgument
from ...netpolicy import EgressPolicy

ALL_TRAFFIC = "0.0.0.0/0"
INTERNET_ENV = "CRYOBOX_E2B_INTERNET"
CREATE_KEYS = frozenset({"allowOut", "denyOut", "allowPublicTraffic", "maskRequestHost"})
UPDATE_KEYS = frozenset({"allowOut", "denyOut", "allow_internet_access"})
REFUSED = {
    "rules": "per-host request transforms are not supported",
    "egressProxy": "tunnelling egress through a SOCKS5 proxy is not supported",
    "dnsServers": "the guest's resolver is cryobox's own (it answers only names the policy lets through)",
    "httpsPorts": "the port proxy speaks plain HTTP to the guest",
}
_WIRE = {
    "allow": "allowOut",
    "deny": "denyOut",
    "public_traffic": "allowPublicTraffic",
    "mask_request_host": "maskRequestHost",
}


@dataclass(frozen=True)
class E2BSettings:
    """The E2B front door's operator settings, read once when the app is built."""

    internet: bool = True
    """What a create (or a network update) that says nothing about the internet gets: E2B's default is on."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> E2BSettings:
        """:raises InvalidArgument: ``CRYOBOX_E2B_INTERNET`` is neither ``allow`` nor ``deny`` (fail at start)."""
        raw = (os.environ if env is None else env).get(INTERNET_ENV, "").strip().lower() or "allow"
        if raw not in ("allow", "deny"):
            raise InvalidArgument(f"{INTERNET_ENV} must be allow or deny, not {raw!r}", details={"env": INTERNET_ENV})
        return cls(internet=raw == "allow")


def _asks(value: Any) -> bool:
    return value is not None and not (isinstance(value, list | dict | str) and len(value) == 0)


def refuse_unenforced(network: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    """:raises InvalidArgument: ``network`` names a key not in ``known`` or asks for one cryobox does not enforce."""
    for key, why in REFUSED.items():
        if key in network and _asks(network[key]):
            raise InvalidArgument(f"{where}.{key}: {why}", details={"field": f"{where}.{key}"})
    unknown = sorted(k for k in network if k not in known and k not in REFUSED)
    if unknown:
        fields = [f"{where}.{k}" for k in unknown]
        raise InvalidArgument(f"unknown field(s) {', '.join(fields)}", details={"fields": fields})


def _rules(network: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = network.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgument(f"{where}.{key} must be a list", details={"field": f"{where}.{key}"})
    return value


def to_policy(
    allow_internet_access: bool | None,
    network: Mapping[str, Any] | None,
    settings: E2BSettings,
    *,
    where: str = "network",
    keep: EgressPolicy | None = None,
) -> EgressPolicy | None:
    """The policy E2B's options ask for; ``None`` when they say nothing at all (no ``allow_internet_access``, no
    ``network``): the caller decides (a snapshot's policy, else the operator's default). ``keep``: an update's
    current policy, whose ingress settings (public traffic, host mask) E2B's update cannot express and keeps."""
    if allow_internet_access is None and network is None:
        return None
    network = network or {}
    deny = _rules(network, "denyOut", where)
    deny_all = any(isinstance(r, str) and r.strip() == ALL_TRAFFIC for r in deny)
    if allow_internet_access is False or deny_all:
        default = "deny"
    elif allow_internet_access is True:
        default = "allow"
    else:
        default = "allow" if settings.internet else "deny"
    value: dict[str, Any] = {
        "default": default,
        "allow": _rules(network, "allowOut", where),
        "deny": [r for r in deny if not (isinstance(r, str) and r.strip() == ALL_TRAFFIC)],
    }
    if keep is not None:
        value.update(public_traffic=keep.public_traffic, mask_request_host=keep.mask_request_host)
    if network.get("allowPublicTraffic") is not None:
        value["public_traffic"] = network["allowPublicTraffic"]
    if network.get("maskRequestHost") is not None:
        value["mask_request_host"] = network["maskRequestHost"]
    try:
        return EgressPolicy.model_validate(value)
    except ValidationError as err:
        first = err.errors()[0]
        loc = [str(p) for p in first["loc"]]
        name = ".".join([where, _WIRE.get(loc[0], loc[0]) if loc else "", *loc[1:]]).rstrip(".")
        message = str(first.get("ctx", {}).get("error", first["msg"]))
        raise InvalidArgument(f"{name}: {message}", details={"field": name}) from err


def default_policy(settings: E2BSettings) -> EgressPolicy:
    """What a sandbox gets when its create says nothing about the network."""
    return EgressPolicy(default="allow" if settings.internet else "deny")


def network_info(policy: EgressPolicy | None) -> tuple[bool, dict[str, Any]]:
    """``allowInternetAccess`` and ``network`` of a sandbox detail (``SandboxNetworkConfig``): the rules as stored,
    ``0.0.0.0/0`` in ``denyOut`` for a default deny."""
    policy = policy if policy is not None else EgressPolicy()
    deny = [*policy.deny, ALL_TRAFFIC] if policy.default == "deny" else list(policy.deny)
    info: dict[str, Any] = {
        "allowOut": list(policy.allow),
        "denyOut": deny,
        "allowPublicTraffic": policy.public_traffic,
    }
    if policy.mask_request_host is not None:
        info["maskRequestHost"] = policy.mask_request_host
    return policy.default == "allow", info


__all__ = [
    "CREATE_KEYS",
    "INTERNET_ENV",
    "UPDATE_KEYS",
    "E2BSettings",
    "default_policy",
    "network_info",
    "refuse_unenforced",
    "to_policy",
]
