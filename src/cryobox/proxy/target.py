"""Where a proxied port's traffic goes: :class:`PortTarget`, the one value the port proxy is handed.

It lives with the proxy (not in the agent interface that also returns it) so the proxy depends on nothing
above it: ``agentapi`` imports it from here for :meth:`~cryobox.agentapi.Agent.port_target`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PortTarget(BaseModel):
    """Where the control plane sends a sandbox port's traffic: ``url`` (``http://host:port`` plus a path
    prefix, no trailing slash) with ``headers`` added to every request (an agent's node token)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    url: str
    headers: dict[str, str] = Field(default_factory=dict)


__all__ = ["PortTarget"]
