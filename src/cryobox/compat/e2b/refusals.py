"""What E2B's create request may ask that cryobox does not carry out yet: refused with 400 naming the field,
never parsed and dropped. A caller that sends MCP servers, IAM, ``secure: false``, a
filesystem-only pause (``autoPauseMemory: false``), ``autoResume`` without ``autoPause``, or the ``network``
options cryobox does not enforce (:mod:`.network`: request rules, an egress proxy, DNS servers, HTTPS ports) must
learn that they do not hold, instead of getting a sandbox that silently differs from what it asked for
(unrestricted egress, a cold boot on resume, ...). Values that ask for nothing (absent, ``null``, empty,
``false``) pass; the default create of the 2.63 SDK sends none of these. ``autoPause`` (hibernate at the
timeout) and ``autoResume`` (requests wake it) are carried out (``api._create``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgument
from .network import CREATE_KEYS
from .network import refuse_unenforced as refuse_network

KNOWN = frozenset(
    {
        "templateID",
        "timeout",
        "metadata",
        "envVars",
        "allow_internet_access",
        "autoPause",
        "autoPauseMemory",
        "autoResume",
        "secure",
        "network",
        "mcp",
        "iam",
        "volumeMounts",
    }
)
NOT_YET = {
    "mcp": "MCP servers started in the sandbox are not supported",
    "iam": "workload identity (iam) is not supported",
}


def _asks(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, Mapping):
        if set(value) == {"enabled"}:
            return bool(value["enabled"])
        return any(_asks(v) for v in value.values())
    if isinstance(value, list | tuple | str):
        return len(value) > 0
    return True


def refuse_unenforced(body: Mapping[str, Any]) -> None:
    """:raises InvalidArgument: ``body`` names a field cryobox does not know, or asks for one it does not enforce."""
    unknown = sorted(k for k in body if k not in KNOWN)
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(unknown)}", details={"fields": unknown})
    for field, why in NOT_YET.items():
        if field in body and _asks(body[field]):
            value = body[field]
            named = sorted(value) if isinstance(value, Mapping) else None
            details: dict[str, Any] = {"field": field}
            if named is not None:
                details["keys"] = named
            raise InvalidArgument(f"{field}: {why}", details=details)
    network = body.get("network")
    if network is not None and not isinstance(network, Mapping):
        raise InvalidArgument("network must be an object", details={"field": "network"})
    if network is not None:
        refuse_network(network, CREATE_KEYS, "network")
    if body.get("autoPauseMemory") is False and body.get("autoPause"):
        raise InvalidArgument(
            "autoPauseMemory: false (a filesystem-only pause, cold-booted on resume) is not supported: cryobox "
            "pauses a sandbox with its memory",
            details={"field": "autoPauseMemory"},
        )
    if _asks(body.get("autoResume")) and not body.get("autoPause"):
        raise InvalidArgument(
            "autoResume needs autoPause: only a sandbox paused at its timeout can resume on a request",
            details={"field": "autoResume"},
        )
    if body.get("secure") is False:
        raise InvalidArgument(
            "secure: false is not supported: cryobox's envd always requires the sandbox's access token",
            details={"field": "secure"},
        )


__all__ = ["KNOWN", "refuse_unenforced"]
