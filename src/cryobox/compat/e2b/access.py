"""Who may reach a sandbox through the E2B sandbox URL: the holder of its envd access token.

The token is not stored anywhere: it is an HMAC of the sandbox id under the registry's key
(:meth:`~cryobox.util.sealing.Sealer.mac`), so every control-plane replica sharing the key recomputes and checks
it, a restored or forked sandbox (a new id) has a new one, and rotating ``CRYOBOX_SECRET_KEY`` keeps old tokens
valid while the old key is still listed. The token is checked before the registry is read, so a wrong token
learns nothing about whether the sandbox exists.

envd's file routes also take a signed URL instead of the token (:mod:`.signing`: what the SDK's ``download_url`` and
``upload_url`` build from the token): checked against the token under every listed key, on the control plane's
clock, before the registry is read too.
"""

from __future__ import annotations

import asyncio

from ...agentapi import Agent
from ...errors import InvalidArgument, NotFound, Unauthorized
from ...registry import SandboxRow
from ...server.access.ratelimit import RateLimiter
from ...server.control.network import in_force
from ...server.control.sandboxes import ControlPlane
from . import signing

PURPOSE = "e2b-envd-access"
TRAFFIC_PURPOSE = "e2b-traffic-access"
"""The traffic token (``trafficAccessToken``): a guest port's traffic only (never envd), so it can be handed to
whoever should reach a server in the sandbox without handing them the sandbox."""
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

    def traffic_token(self, sandbox_id: str) -> str:
        return self._control.registry.sealer.mac(TRAFFIC_PURPOSE, sandbox_id)

    def verify(self, sandbox_id: str, token: str | None, *, traffic: bool = False) -> bool:
        """Whether ``token`` is the sandbox's access token (or, for a guest port's ``traffic``, its traffic token)."""
        if not token:
            return False
        sealer = self._control.registry.sealer
        if sealer.verify_mac(PURPOSE, sandbox_id, token):
            return True
        return traffic and sealer.verify_mac(TRAFFIC_PURPOSE, sandbox_id, token)

    async def _public(self, sandbox_id: str) -> bool:
        """Whether the sandbox's policy lets its ports take traffic without a token (``public_traffic``); ``False``
        for an unknown sandbox, so a refusal says nothing about whether it exists."""
        try:
            row = await asyncio.to_thread(self._control.registry.get_sandbox, sandbox_id)
        except NotFound:
            return False
        return in_force(row.egress).public_traffic

    def check_signature(self, sandbox_id: str, claim: signing.FileSignature) -> None:
        """Accept a signed file URL of the sandbox (:func:`.signing.check`). :raises Unauthorized: it is not."""
        tokens = self._control.registry.sealer.macs(PURPOSE, sandbox_id)
        signing.check(claim, tokens, self._control.fleet.clock())

    async def open(
        self,
        sandbox_id: str | None,
        token: str | None,
        *,
        wake: bool = True,
        traffic: bool = False,
        signed: signing.FileSignature | None = None,
    ) -> tuple[SandboxRow, Agent]:
        """The sandbox's row and agent, once ``token`` is its access token (rate-limited like its workspace's
        API calls); a guest port's ``traffic`` without a token, once the sandbox's policy makes its ports public;
        a file route's request without a token, once its ``signed`` URL checks out (a token, when there is one,
        decides alone, as in envd). :raises Unauthorized: no or a wrong token or signature. :raises NotFound: no
        such sandbox."""
        if not sandbox_id:
            raise InvalidArgument("missing the E2b-Sandbox-Id header")
        if signed is not None and not token:
            self.check_signature(sandbox_id, signed)
        elif not self.verify(sandbox_id, token, traffic=traffic) and not (
            traffic and not token and await self._public(sandbox_id)
        ):
            raise Unauthorized("missing or invalid sandbox access token (X-Access-Token)")
        row, agent = await self._control.route(sandbox_id, None, wake=wake)
        self._limiter.check(row.workspace_id)
        return row, agent
