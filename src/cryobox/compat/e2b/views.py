"""The E2B control-plane API's request bodies and response shapes (``spec/openapi.yml`` of e2b-dev/E2B, as the
pinned ``e2b`` SDK reads them). Unknown request fields are ignored; responses carry what the SDK requires."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...registry import SandboxRow, SnapshotRow
from ...util.times import rfc3339
from .network import network_info
from .refusals import refuse_unenforced

ENVD_VERSION = "0.6.4"
"""What every sandbox reports as its envd version: the highest the pinned SDK gates a feature on (watching network
mounts), so it uses every feature the envd served here implements."""
DEFAULT_TIMEOUT_S = 300
"""E2B's default sandbox timeout when a create names none."""
MAX_TIMEOUT_S = 24 * 3600
TEMPLATE_ALIASES = {"base": "base", "code-interpreter-v1": "code-interpreter", "code-interpreter": "code-interpreter"}
SNAPSHOT_NAME_LABEL = "e2b.name"
PAUSED_STATES = frozenset({"paused", "hibernated"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AutoResume(_Body):
    enabled: bool = False


class VolumeMountBody(BaseModel):
    """One of ``volumeMounts``: volume ``name`` (by name, as the SDK sends it) at ``path``, read-write."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    path: str = Field(min_length=2, max_length=4096)


class NewSandbox(_Body):
    """E2B's create request (``NewSandbox``/``NewSandboxV2``); what cryobox does not enforce is refused first."""

    template_id: str = Field(default="base", alias="templateID", min_length=1, max_length=256)
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)
    auto_pause: bool = Field(default=False, alias="autoPause")
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")
    volume_mounts: list[VolumeMountBody] = Field(default_factory=list, alias="volumeMounts", max_length=4)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    """E2B's ``SandboxNetworkConfig`` (camelCase keys), checked by :mod:`.refusals`, mapped by :mod:`.network`."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_unenforced(data)
        return data


class TimeoutBody(_Body):
    timeout: int = Field(ge=0, le=MAX_TIMEOUT_S)


class ConnectBody(_Body):
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)


class RefreshBody(_Body):
    duration: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)


class ForkBody(_Body):
    count: int = Field(default=1, ge=1, le=64)
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)


class SnapshotBody(_Body):
    name: str | None = Field(default=None, max_length=256)


def e2b_state(row: SandboxRow) -> str:
    return "paused" if row.status in PAUSED_STATES else "running"


def template_id(row: SandboxRow) -> str:
    return row.from_snapshot or row.template


def sandbox(row: SandboxRow, token: str, traffic_token: str | None = None, domain: str | None = None) -> dict[str, Any]:
    """``Sandbox``: what create, connect and fork return. ``trafficAccessToken`` opens the sandbox's ports (not
    envd), and is returned, as by E2B, only when the policy keeps them private (``allowPublicTraffic: false``):
    public ports need no token (the code-interpreter SDK then sends none to port 49999's context routes).
    ``domain``: the operator's sandbox domain (the SDK's hosts are ``{port}-{id}.{domain}``); null without one,
    and the SDK then uses its own ``E2B_DOMAIN``."""
    public = row.egress is None or row.egress.public_traffic
    return {
        "trafficAccessToken": None if public else traffic_token,
        "templateID": template_id(row),
        "sandboxID": row.id,
        "clientID": row.host or "cryobox",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "domain": domain,
        "alias": row.template,
    }


def _end_at(row: SandboxRow) -> str:
    if row.expires_at is not None:
        return rfc3339(row.expires_at)
    if row.persistent or row.ttl_s is None:
        return rfc3339(max(time.time(), row.created_at) + 10 * 365 * 86400)  # never expires
    return rfc3339(row.last_active_at + row.ttl_s)


def listed(row: SandboxRow) -> dict[str, Any]:
    """``ListedSandbox``."""
    return {
        "templateID": template_id(row),
        "alias": row.template,
        "sandboxID": row.id,
        "clientID": row.host or "cryobox",
        "startedAt": rfc3339(row.created_at),
        "endAt": _end_at(row),
        "cpuCount": row.cpus,
        "memoryMB": row.memory_mib,
        "diskSizeMB": 0,
        "state": e2b_state(row),
        "envdVersion": ENVD_VERSION,
        "metadata": dict(row.metadata),
    }


def detail(
    row: SandboxRow, token: str, domain: str | None = None, mounts: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """``SandboxDetail``, with the network policy as E2B's ``allowInternetAccess`` and ``network``; ``domain`` as
    in :func:`sandbox`; ``mounts``: its ``volumeMounts`` (``{name, path}``)."""
    internet, network = network_info(row.egress)
    return {
        **listed(row),
        "envdAccessToken": token,
        "domain": domain,
        "allowInternetAccess": internet,
        "network": network,
        "lifecycle": {"autoResume": row.auto_wake, "onTimeout": "pause" if row.on_timeout == "hibernate" else "kill"},
        "volumeMounts": list(mounts or []),
    }


def snapshot_info(row: SnapshotRow) -> dict[str, Any]:
    name = row.labels.get(SNAPSHOT_NAME_LABEL)
    return {"snapshotID": row.id, "names": [name] if name else []}


def error(status: int, message: str) -> dict[str, Any]:
    return {"code": status, "message": message}
