"""The IO-free part of a sandbox's network policy and egress log: building the policy a call sends, the requests,
and parsing their answers (shared by ``Sandbox`` and ``AsyncSandbox``).

A policy is always sent whole: ``PUT /v1/sandboxes/{id}/network`` replaces the policy in force, and any field the
body leaves out is reset to its default (``default: deny``, no rules, any port, public traffic, no host mask).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import RootModel, ValidationError

from .. import models
from ..errors import InvalidArgument
from ._base import parse_model
from ._requests import ApiRequest

PolicyLike = models.NetworkPolicy | Mapping[str, Any]
"""A policy, or a mapping of its fields (validated before anything is sent)."""
CreateNetwork = models.NetworkPolicy | models.NetworkSpec | Mapping[str, Any]
"""What ``create(network=...)`` takes: a policy, or the older ``{"egress": "allow"|"deny", "allow": [cidrs]}``."""


def as_policy(value: PolicyLike, *, field: str = "network") -> models.NetworkPolicy:
    """``value`` as a policy. :raises InvalidArgument: naming the field and what is wrong with it."""
    if isinstance(value, models.NetworkPolicy):
        return value
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{field}: expected a policy or a mapping, got {type(value).__name__}")
    return models.NetworkPolicy.parse(dict(value), field=field)


def build_policy(
    policy: PolicyLike | None = None,
    *,
    default: Literal["allow", "deny"] | None = None,
    allow: Iterable[str] | None = None,
    deny: Iterable[str] | None = None,
    ports: Iterable[int] | None = None,
    public_traffic: bool | None = None,
    mask_request_host: str | None = None,
) -> models.NetworkPolicy:
    """The whole policy ``set_network`` sends: ``policy`` (or an empty one) with every keyword that is not
    ``None`` put in place of its field; any field neither gives is the default.

    :raises InvalidArgument: the result is not a valid policy (nothing is sent).
    """
    fields: dict[str, Any] = {} if policy is None else as_policy(policy).model_dump()
    given = {
        "default": default,
        "allow": None if allow is None else _strings(allow, "allow"),
        "deny": None if deny is None else _strings(deny, "deny"),
        "ports": None if ports is None else list(ports),
        "public_traffic": public_traffic,
        "mask_request_host": mask_request_host,
    }
    fields.update({key: value for key, value in given.items() if value is not None})
    return as_policy(fields)


def _strings(rules: Iterable[str], field: str) -> list[str]:
    if isinstance(rules, str):
        raise InvalidArgument(f"network.{field}: must be a list of rules, not a single string")
    return list(rules)


def create_body(network: CreateNetwork) -> dict[str, Any]:
    """The ``network`` field of ``POST /v1/sandboxes``: a policy, or the older shape sent as it was given.

    :raises InvalidArgument: not a valid policy (or older network spec).
    """
    if isinstance(network, models.NetworkSpec):
        return network.model_dump()
    if isinstance(network, Mapping) and "egress" in network:
        try:
            return models.NetworkSpec.model_validate(dict(network)).model_dump()
        except ValidationError as err:
            raise InvalidArgument(f"invalid network spec: {err}") from err
    return as_policy(network).model_dump(mode="json")


def _network_path(sandbox_id: str, suffix: str) -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def get_network_request(sandbox_id: str) -> ApiRequest:
    return ApiRequest("GET", _network_path(sandbox_id, "/network"))


def set_network_request(sandbox_id: str, policy: models.NetworkPolicy) -> ApiRequest:
    return ApiRequest("PUT", _network_path(sandbox_id, "/network"), json=policy.model_dump(mode="json"))


def egress_log_request(sandbox_id: str, *, limit: int) -> ApiRequest:
    """:raises InvalidArgument: ``limit`` is not 0 to 1000 (nothing is sent)."""
    if isinstance(limit, bool) or not 0 <= limit <= models.network.MAX_EGRESS_LIMIT:
        raise InvalidArgument(f"limit must be 0-{models.network.MAX_EGRESS_LIMIT}, got {limit!r}")
    return ApiRequest("GET", _network_path(sandbox_id, "/egress"), params={"limit": str(limit)})


def parse_policy(response: httpx.Response) -> models.NetworkPolicy:
    """``GET …/network``: the policy object itself."""
    return parse_model(RootModel[models.network.PolicyView], response).root


def parse_egress_log(response: httpx.Response) -> models.EgressLog:
    return parse_model(models.EgressLog, response)
