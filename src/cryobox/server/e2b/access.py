"""Who may reach a sandbox through the E2B sandbox URL: the holder of its envd access token.

The token is not stored anywhere: it is an HMAC of the sandbox id under the registry's key
(:meth:`~cryobox.util.sealing.Sealer.mac`), so every control-plane replica sharing the key recomputes and checks
it, a restored or forked sandbox (a new id) has a new one, and rotating ``CRYOBOX_SECRET_KEY`` keeps old tokens
valid while the old key is still listed. The token is checked before the registry is read, so a wrong token
learns nothing about whether the sandbox exists.
"""

from __future__ import annotations

from ...agentapi import Agent
from ...errors import InvalidArgument, Unauthorized
from ...registry import SandboxRow
from ..control import ControlPlane
from ..ratelimit import RateLimiter

PURPOSE = "e2b-envd-access"
SANDBOX_HEADER = "e2b-sandbox-id"
PORT_HEADER = "e2b-sandbox-port"
TOKEN_HEADER = "x-access-token"
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"


class SandboxAccess:
    def __init__(self, control: ControlPlane, limiter: RateLimiter) -> None:
        self._control = control
        self._limiter = limiter

    def token(self, sandbox_id: str) -> str:
        """The sandbox's envd access token (what create, connect and get return as ``envdAccessToken``)."""
        return self._control.registry.sealer.mac(PURPOSE, sandbox_id)

    def verify(self, sandbox_id: str, token: str | None) -> bool:
        return (
            bool(token) and token is not None and self._control.registry.sealer.verify_mac(PURPOSE, sandbox_id, token)
        )

    async def open(self, sandbox_id: str | None, token: str | None, *, wake: bool = True) -> tuple[SandboxRow, Agent]:
        """The sandbox's row and agent, once ``token`` is its access token (rate-limited like its workspace's
        API calls). :raises Unauthorized: no or a wrong token. :raises NotFound: no such sandbox."""
        if not sandbox_id:
            raise InvalidArgument("missing the E2b-Sandbox-Id header")
        if not self.verify(sandbox_id, token):
            raise Unauthorized("missing or invalid sandbox access token (X-Access-Token)")
        row, agent = await self._control.route(sandbox_id, None, wake=wake)
        self._limiter.check(row.workspace_id)
        return row, agent
