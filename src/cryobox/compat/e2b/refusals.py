"""What E2B's create request may ask that cryobox does not carry out yet: refused with 400 naming the field,
never parsed and dropped. A caller that sends ``autoPause``/``autoResume``, MCP servers, IAM, volume mounts,
``secure: false`` or the ``network`` options cryobox does not enforce (:mod:`.network`: request rules, an egress
proxy, DNS servers, HTTPS ports) must learn that they do not hold, instead of getting a sandbox that silently
differs from what it asked for (unrestricted egress, deletion at the timeout, ...). Values that ask for nothing
(absent, ``null``, empty, ``false``) pass; the default create of the 2.63 SDK sends none of these.
``autoPauseMemory`` only shapes what ``autoPause`` does, so it passes whenever ``autoPause`` does."""

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
    "autoPause": "a sandbox that pauses at its timeout is not supported yet: at its timeout it is killed",
    "autoResume": "auto-resume is not supported yet",
    "mcp": "MCP servers started in the sandbox are not supported",
    "iam": "workload identity (iam) is not supported",
    "volumeMounts": "volumes are not supported yet",
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
    if body.get("secure") is False:
        raise InvalidArgument(
            "secure: false is not supported: cryobox's envd always requires the sandbox's access token",
            details={"field": "secure"},
        )


__all__ = ["KNOWN", "refuse_unenforced"]
