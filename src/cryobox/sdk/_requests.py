"""The requests of the public API, built without IO (shared by ``Sandbox`` and ``AsyncSandbox``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ._base import CONNECT_TIMEOUT_S, EXEC_READ_MARGIN_S

# --- requests --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiRequest:
    """One API call, ready to send. ``retry_capacity`` marks the calls that may retry capacity refusals."""

    method: str
    path: str
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] | None = None
    timeout: httpx.Timeout | None = None
    retry_capacity: bool = False
    data: dict[str, str] | None = None
    """Form fields (with ``files``: a multipart body)."""
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None

    def send_options(self) -> dict[str, Any]:
        """Keyword arguments for ``client.request`` / ``client.stream`` (besides method and path)."""
        options: dict[str, Any] = {
            "params": self.params,
            "json": self.json,
            "content": self.content,
            "headers": self.headers,
            "timeout": self.timeout if self.timeout is not None else httpx.USE_CLIENT_DEFAULT,
        }
        if self.data is not None or self.files is not None:
            options.update(data=self.data, files=self.files)
        return options


def _sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def create_request(
    template: str,
    *,
    ttl_seconds: int | None,
    persistent: bool,
    metadata: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    network: Mapping[str, Any] | None,
    from_snapshot: str | None,
    on_timeout: str | None = None,
    auto_wake: bool | None = None,
    volumes: Sequence[Mapping[str, Any]] | None = None,
) -> ApiRequest:
    """``network`` is the field as sent, already validated (``_network.create_body``)."""
    body: dict[str, Any] = {
        "template": template,
        "persistent": persistent,
        "metadata": dict(metadata or {}),
        "env": dict(env or {}),
    }
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if from_snapshot is not None:
        body["from_snapshot"] = from_snapshot
    if network is not None:
        body["network"] = dict(network)
    if on_timeout is not None:
        body["on_timeout"] = on_timeout
    if auto_wake is not None:
        body["auto_wake"] = auto_wake
    if volumes is not None:
        body["volumes"] = [dict(v) for v in volumes]
    return ApiRequest("POST", "/v1/sandboxes", json=body, retry_capacity=True)


def get_request(sandbox_id: str) -> ApiRequest:
    return ApiRequest("GET", _sandbox_path(sandbox_id))


def inspect_net_request(sandbox_id: str) -> ApiRequest:
    return ApiRequest("GET", _sandbox_path(sandbox_id, "/net"))


def list_request(*, status: str | None, metadata: Mapping[str, str] | None) -> ApiRequest:
    params: dict[str, str] = {}
    if status is not None:
        params["status"] = status
    for key, value in (metadata or {}).items():
        params[f"metadata.{key}"] = value
    return ApiRequest("GET", "/v1/sandboxes", params=params or None)


def kill_request(sandbox_id: str, *, keep_snapshots: bool = False) -> ApiRequest:
    params = {"keep_snapshots": "true"} if keep_snapshots else None
    return ApiRequest("DELETE", _sandbox_path(sandbox_id), params=params)


def lifecycle_request(sandbox_id: str) -> ApiRequest:
    return ApiRequest("GET", _sandbox_path(sandbox_id, "/lifecycle"))


def update_lifecycle_request(
    sandbox_id: str,
    *,
    ttl_seconds: int | None = None,
    persistent: bool | None = None,
    on_timeout: str | None = None,
    auto_wake: bool | None = None,
) -> ApiRequest:
    body: dict[str, Any] = {}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if persistent is not None:
        body["persistent"] = persistent
    if on_timeout is not None:
        body["on_timeout"] = on_timeout
    if auto_wake is not None:
        body["auto_wake"] = auto_wake
    return ApiRequest("PATCH", _sandbox_path(sandbox_id, "/lifecycle"), json=body)


def exec_timeout(client_timeout_s: float, timeout_seconds: float | None) -> httpx.Timeout:
    """Never let the HTTP read timeout cut a command short: wait at least its own timeout plus a margin."""
    read = None if timeout_seconds is None else max(client_timeout_s, timeout_seconds + EXEC_READ_MARGIN_S)
    return httpx.Timeout(client_timeout_s, connect=CONNECT_TIMEOUT_S, read=read)


def exec_request(
    sandbox_id: str,
    cmd: str,
    *,
    timeout_seconds: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: str | None,
    client_timeout_s: float,
    stream: bool = False,
) -> ApiRequest:
    body = {"cmd": cmd, "timeout_seconds": timeout_seconds, "env": dict(env or {}), "cwd": cwd, "stdin": stdin}
    path = _sandbox_path(sandbox_id, "/exec/stream" if stream else "/exec")
    return ApiRequest("POST", path, json=body, timeout=exec_timeout(client_timeout_s, timeout_seconds))


def fs_request(
    sandbox_id: str, method: str, path: str, *, suffix: str = "", content: bytes | None = None
) -> ApiRequest:
    """``/v1/sandboxes/{id}/fs{suffix}?path=…``; a body is sent as raw bytes."""
    headers = {"Content-Type": "application/octet-stream"} if content is not None else None
    return ApiRequest(
        method, _sandbox_path(sandbox_id, f"/fs{suffix}"), params={"path": path}, content=content, headers=headers
    )


def file_url_request(
    sandbox_id: str, path: str, operation: str, *, expires_in: int | None, user: str | None
) -> ApiRequest:
    """``POST /v1/sandboxes/{id}/files/url``; unset options are left to the server's defaults."""
    body: dict[str, Any] = {"path": path, "operation": operation}
    if expires_in is not None:
        body["expires_in"] = expires_in
    if user is not None:
        body["user"] = user
    return ApiRequest("POST", _sandbox_path(sandbox_id, "/files/url"), json=body)


# --- power state, snapshots and forks --------------------------------------------------------------------------

PowerAction = Literal["pause", "resume", "hibernate", "wake"]


def power_request(sandbox_id: str, action: PowerAction) -> ApiRequest:
    return ApiRequest("POST", _sandbox_path(sandbox_id, f"/{action}"))


def _snapshot_path(snapshot_id: str, suffix: str = "") -> str:
    return f"/v1/snapshots/{quote(snapshot_id, safe='')}{suffix}"


def snapshot_request(sandbox_id: str, *, labels: Mapping[str, str] | None, retain: bool, quiesce: bool) -> ApiRequest:
    body = {"labels": dict(labels or {}), "retain": retain, "quiesce": quiesce}
    return ApiRequest("POST", _sandbox_path(sandbox_id, "/snapshots"), json=body)


def list_snapshots_request(*, sandbox_id: str | None, labels: Mapping[str, str] | None) -> ApiRequest:
    params: dict[str, str] = {}
    if sandbox_id is not None:
        params["sandbox_id"] = sandbox_id
    for key, value in (labels or {}).items():
        params[f"label.{key}"] = value
    return ApiRequest("GET", "/v1/snapshots", params=params or None)


def get_snapshot_request(snapshot_id: str) -> ApiRequest:
    return ApiRequest("GET", _snapshot_path(snapshot_id))


def publish_snapshot_request(snapshot_id: str) -> ApiRequest:
    return ApiRequest("POST", _snapshot_path(snapshot_id, "/publish"), timeout=httpx.Timeout(600.0, connect=10.0))


def import_snapshot_request(snapshot_id: str, *, labels: Mapping[str, str] | None, retain: bool) -> ApiRequest:
    body = {"id": snapshot_id, "labels": dict(labels or {}), "retain": retain}
    return ApiRequest("POST", "/v1/snapshots/import", json=body, timeout=httpx.Timeout(600.0, connect=10.0))


def delete_snapshot_request(snapshot_id: str) -> ApiRequest:
    return ApiRequest("DELETE", _snapshot_path(snapshot_id))


def update_snapshot_request(
    snapshot_id: str, *, labels: Mapping[str, str] | None = None, retain: bool | None = None
) -> ApiRequest:
    """``labels`` replaces the whole map; a field left ``None`` is not sent (unchanged)."""
    body: dict[str, Any] = {}
    if labels is not None:
        body["labels"] = dict(labels)
    if retain is not None:
        body["retain"] = retain
    return ApiRequest("PATCH", _snapshot_path(snapshot_id), json=body)


def evidence_list_request(snapshot_id: str) -> ApiRequest:
    return ApiRequest("GET", _snapshot_path(snapshot_id, "/evidence"))


def evidence_request(snapshot_id: str, name: str, *, content: bytes | None = None) -> ApiRequest:
    """``GET`` (``content`` is ``None``) or ``PUT`` one evidence file of a snapshot; the body is raw bytes."""
    path = _snapshot_path(snapshot_id, f"/evidence/{quote(name, safe='')}")
    if content is None:
        return ApiRequest("GET", path)
    return ApiRequest("PUT", path, content=content, headers={"Content-Type": "application/octet-stream"})


# forks create sandboxes: like a create, a capacity refusal (sent before anything was created) is retried
def fork_request(sandbox_id: str, *, metadata: Mapping[str, str] | None) -> ApiRequest:
    body = {"metadata": dict(metadata or {})}
    return ApiRequest("POST", _sandbox_path(sandbox_id, "/fork"), json=body, retry_capacity=True)


def fork_tree_request(sandbox_id: str, *, count: int, metadata: Mapping[str, str] | None) -> ApiRequest:
    body = {"count": count, "metadata": dict(metadata or {})}
    return ApiRequest("POST", _sandbox_path(sandbox_id, "/fork-tree"), json=body, retry_capacity=True)


def promote_request(sandbox_id: str, *, tree_id: str, cleanup_siblings: bool) -> ApiRequest:
    body = {"tree_id": tree_id, "cleanup_siblings": cleanup_siblings}
    return ApiRequest("POST", _sandbox_path(sandbox_id, "/promote"), json=body)
