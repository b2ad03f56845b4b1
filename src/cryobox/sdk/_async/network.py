"""A sandbox's network policy, changed live, and its egress decision log: ``sbx.network``, ``get_network()``,
``set_network(...)`` and ``egress_log()`` (``AsyncSandbox`` has them through ``AsyncNetworkControl``).

A policy says where the guest may connect: ``default`` (``allow`` or ``deny``) for what no rule matches, ``allow``
and ``deny`` rules (IPv4 networks and addresses, host names, ``*.example.org``; where both match, deny wins),
``ports`` egress may use (empty: any), plus who may reach the guest's ports (``public_traffic``) and the ``Host``
the port proxy sends (``mask_request_host``). Example::

    await sbx.set_network(default="deny", allow=["api.example.com", "*.example.net"], ports=[443])
    await sbx.exec("pip download requests")
    log = await sbx.egress_log(limit=20)
    for decision in log.items:
        print(decision.name, decision.ip, decision.port, decision.allowed, decision.reason)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import httpx

from ... import models
from .. import _base, _network
from .._base import RetryPolicy
from .._network import PolicyLike
from ._http import send


class AsyncNetworkControl:
    """What a sandbox object needs to read and replace its network policy and read its egress log."""

    info: models.Sandbox
    _http: httpx.AsyncClient
    _retry: RetryPolicy

    @property
    def network(self) -> models.NetworkPolicy | None:
        """The policy in force when ``info`` was last read (no IO; ``get_network()`` asks the server).
        ``None`` from a server that predates policies."""
        return self.info.network

    async def get_network(self) -> models.NetworkPolicy:
        """The policy in force now (``GET /v1/sandboxes/{id}/network``); ``info.network`` is updated with it.

        :raises NotFound: no such sandbox.
        """
        policy = _network.parse_policy(await send(self._http, _network.get_network_request(self.info.id), self._retry))
        self.info = self.info.model_copy(update={"network": policy})
        return policy

    async def set_network(
        self,
        policy: PolicyLike | None = None,
        *,
        default: Literal["allow", "deny"] | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] | None = None,
        ports: Iterable[int] | None = None,
        public_traffic: bool | None = None,
        mask_request_host: str | None = None,
    ) -> models.NetworkPolicy:
        """Replace the sandbox's whole network policy, live, and return the policy now in force.

        This is not a patch: the policy sent is ``policy`` (a ``NetworkPolicy`` or a mapping of its fields; none:
        an empty one) with each keyword that is not ``None`` in place of its field, and every field neither gives
        takes its default (``default="deny"``, no rules, any port, ``public_traffic=True``, no host mask). So
        ``set_network()`` alone denies all egress, and ``set_network(allow=["10.0.0.0/8"])`` drops every rule
        in force before. To change one field, start from the current policy::

            await sbx.set_network(await sbx.get_network(), ports=[443])

        Connections the new policy no longer allows are cut. ``info`` is refreshed from the answer.

        :raises InvalidArgument: not a valid policy (checked before sending, and by the server).
        :raises NotFound: no such sandbox.
        """
        new = _network.build_policy(
            policy,
            default=default,
            allow=allow,
            deny=deny,
            ports=ports,
            public_traffic=public_traffic,
            mask_request_host=mask_request_host,
        )
        response = await send(self._http, _network.set_network_request(self.info.id, new), self._retry)
        self.info = _base.parse_sandbox(response)
        return self.info.network if self.info.network is not None else new

    async def egress_log(self, limit: int = 100) -> models.EgressLog:
        """The newest ``limit`` (0 to 1000) egress decisions, oldest first: every connection (and DNS query) the
        sandbox's policy allowed or denied, with the rule that decided and the bytes moved; ``dropped`` counts
        older decisions no longer kept.

        :raises InvalidArgument: ``limit`` is out of range.
        :raises NotFound: no such sandbox.
        """
        request = _network.egress_log_request(self.info.id, limit=limit)
        return _network.parse_egress_log(await send(self._http, request, self._retry))


__all__ = ["AsyncNetworkControl"]
