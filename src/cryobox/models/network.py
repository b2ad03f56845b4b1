"""Wire models of a sandbox's network policy (``/v1/sandboxes/{id}/network``) and its egress decision log
(``/v1/sandboxes/{id}/egress``), shared by the server and the SDK.

Imported into :mod:`cryobox.models` (use them from there). The policy is :class:`cryobox.netpolicy.EgressPolicy`
itself (``NetworkPolicy`` names it on the wire): one value, validated alike wherever it is read.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ..netpolicy import EgressPolicy

NetworkPolicy = EgressPolicy
"""A sandbox's whole network policy: ``default`` (``allow``/``deny``), ``allow`` and ``deny`` rules (IPv4
networks, addresses, host names, ``*.example.org``), ``ports``, ``public_traffic``, ``mask_request_host``."""

MAX_EGRESS_LIMIT = 1000
"""The most decisions one ``GET /v1/sandboxes/{id}/egress`` returns (``limit``, default 100)."""


def _known_fields(value: Any) -> Any:
    """A policy read from a response keeps only the fields this version knows: a server that adds one must not
    make every sandbox unreadable to older clients (a request is still validated strictly)."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k in EgressPolicy.model_fields}
    return value


PolicyView = Annotated[EgressPolicy, BeforeValidator(_known_fields)]
"""A policy as a response carries it (the Sandbox view's ``network``, ``GET …/network``)."""


class EgressDecision(BaseModel):
    """One decision of a sandbox's egress proxy or name server: a connection (or DNS query) allowed or denied."""

    model_config = ConfigDict(frozen=True)

    time: float
    """When the connection (or query) arrived, epoch seconds."""
    name: str | None = None
    """The name it carried (TLS SNI, HTTP ``Host``, the DNS query), if any."""
    ip: str | None = None
    """The address judged (and, when allowed, connected to); none for a DNS query."""
    port: int
    allowed: bool
    reason: str
    """The rule that decided: ``floor``, ``port``, ``deny-name``, ``deny-cidr``, ``allow-name``, ``allow-cidr``,
    ``default``, ``unresolved``, ``limit`` or ``dns``."""
    bytes_out: int = 0
    bytes_in: int = 0
    error: str | None = None
    """``unreachable`` (allowed, but the destination did not answer) or ``cut`` (ended by a policy change)."""


class EgressLog(BaseModel):
    """``GET /v1/sandboxes/{id}/egress``: the newest decisions kept, oldest first; ``dropped`` counts older ones
    no longer kept."""

    model_config = ConfigDict(frozen=True)

    items: list[EgressDecision] = Field(default_factory=list)
    dropped: int = 0


__all__ = ["MAX_EGRESS_LIMIT", "EgressDecision", "EgressLog", "NetworkPolicy", "PolicyView"]
