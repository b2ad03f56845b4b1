"""The control plane's end of the agent HTTP API: :class:`HttpAgent` implements :class:`~.interface.Agent` over
the routes of :func:`~.http_server.create_agent_app`.

Error bodies are rebuilt into the same :mod:`cryobox.errors` class (message and details kept; ``Retry-After``
becomes ``retry_after_s``). Failing to reach the agent (connect error or timeout, nothing was sent) is
``HostUnavailable``; a transport failure after the request went out (the agent died or stalled mid-answer, so
the call may have taken effect) is a plain ``CryoboxError``. Streams are async generators over NDJSON lines:
close them (``aclose()`` or ``contextlib.aclosing``) when stopping early, which closes the HTTP response.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import ERRORS_BY_CODE, CryoboxError, HostUnavailable, InvalidArgument, QuotaExceeded
from . import models as m
from .http_procs_client import ProcClient

M = TypeVar("M", bound=BaseModel)

PREFIX = "/agent/v1"
CONNECT_TIMEOUT_S = 10.0
EXEC_READ_MARGIN_S = 60.0
LONG_CALL_TIMEOUT_S = 3600.0
"""Snapshots, forks and uploads to the store: minutes of disk and network work, never a short read timeout."""
UNREACHABLE_RETRY_S = 2.0

_SANDBOXES = TypeAdapter(list[m.SandboxInfo])
_TEMPLATES = TypeAdapter(list[m.TemplateInfo])
_EVIDENCE = TypeAdapter(list[m.EvidenceEntry])
_OBJECT = TypeAdapter(dict[str, Any])
_CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return None if math.isnan(seconds) or seconds < 0 else seconds


def rebuild_error(body: Any, *, status: int = 500, retry_after_s: float | None = None) -> CryoboxError:
    """The :class:`CryoboxError` a wire body ``{"error", "code", "details"}`` stands for."""
    body = body if isinstance(body, dict) else {}
    message = body.get("error")
    if not isinstance(message, str) or not message:
        message = f"agent answered HTTP {status}"
    details = body.get("details")
    details = dict(details) if isinstance(details, dict) else {}
    cls = ERRORS_BY_CODE.get(str(body.get("code") or ""))
    if cls is None:
        by_status = [c for c in ERRORS_BY_CODE.values() if c.http_status == status and c.http_status != 500]
        cls = by_status[0] if len(by_status) == 1 else CryoboxError
    if issubclass(cls, HostUnavailable | QuotaExceeded):
        return cls(message, retry_after_s=1.0 if retry_after_s is None else retry_after_s, details=details)
    return cls(message, details=details)  # StateError takes state/required from details


def error_from_response(response: httpx.Response) -> CryoboxError:
    try:
        body = response.json()
    except ValueError:
        body = None
    retry = _retry_after(response.headers.get("retry-after"))
    return rebuild_error(body, status=response.status_code, retry_after_s=retry)


class HttpAgent(ProcClient):
    """An :class:`~.interface.Agent` reached over HTTP at ``url`` with the node ``token``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        name: str = "",
    ) -> None:
        if not token:
            raise InvalidArgument("an agent token is required")
        self.url = url.rstrip("/")
        self._token = token
        self.name = name
        self.timeout_s = timeout_s
        self._connect_s = min(CONNECT_TIMEOUT_S, timeout_s)
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "cryobox-control-plane"},
            timeout=httpx.Timeout(timeout_s, connect=self._connect_s),
            # open terminals and streams each hold a connection: never make other calls queue behind them
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"HttpAgent({self.url!r}, name={self.name!r})"

    async def __aenter__(self) -> HttpAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _timeout(self, read_s: float | None) -> httpx.Timeout:
        return httpx.Timeout(read_s, connect=self._connect_s)

    def _long(self) -> httpx.Timeout:
        return self._timeout(max(self.timeout_s, LONG_CALL_TIMEOUT_S))

    def _exec_timeout(self, request: m.ExecRequest) -> httpx.Timeout:
        return self._timeout(None if request.timeout_s is None else request.timeout_s + EXEC_READ_MARGIN_S)

    def _transport_error(self, err: httpx.TransportError) -> CryoboxError:
        who = self.name or self.url
        if isinstance(err, _CONNECT_FAILURES):
            return HostUnavailable(
                f"agent {who} is unreachable: {type(err).__name__}: {err}",
                retry_after_s=UNREACHABLE_RETRY_S,
                details={"agent": self.name},
            )
        return CryoboxError(
            f"request to agent {who} failed mid-way (it may have taken effect): {type(err).__name__}: {err}",
            details={"agent": self.name},
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        kwargs: dict[str, Any] = {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            response = await self._client.request(
                method, PREFIX + path, json=json_body, content=content, params=params, **kwargs
            )
        except httpx.TransportError as err:
            raise self._transport_error(err) from err
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def _unexpected(self, response: httpx.Response, err: Exception) -> CryoboxError:
        request = response.request
        return CryoboxError(
            f"unexpected answer from agent {self.name or self.url} to {request.method} {request.url.path}: {err}",
            details={"agent": self.name, "status": response.status_code},
        )

    def _parse(self, adapter: TypeAdapter[Any] | type[BaseModel], response: httpx.Response) -> Any:
        try:
            if isinstance(adapter, TypeAdapter):
                return adapter.validate_json(response.content)
            return adapter.model_validate_json(response.content)
        except ValidationError as err:
            raise self._unexpected(response, err) from err

    async def _model(self, model: type[M], method: str, path: str, **kw: Any) -> M:
        response = await self._send(method, path, **kw)
        result: M = self._parse(model, response)
        return result

    async def _stream(self, path: str, body: BaseModel, model: type[M], timeout: httpx.Timeout) -> AsyncIterator[M]:
        payload = body.model_dump(mode="json")
        try:
            async with self._client.stream("POST", PREFIX + path, json=payload, timeout=timeout) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_from_response(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield self._stream_item(model, line, response)
        except httpx.TransportError as err:
            raise self._transport_error(err) from err

    def _stream_item(self, model: type[M], line: str, response: httpx.Response) -> M:
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("a stream line is not a JSON object")
            if "error" in item:
                retry = item.get("retry_after_s")
                retry_s = float(retry) if isinstance(retry, int | float) else None
                raise rebuild_error(item["error"], retry_after_s=retry_s)
            return model.model_validate(item["event"])
        except (ValueError, KeyError) as err:  # includes ValidationError and JSONDecodeError
            raise self._unexpected(response, err) from err

    # -- the host ------------------------------------------------------------------------------------------------

    async def info(self) -> m.AgentInfo:
        return await self._model(m.AgentInfo, "GET", "/info")

    async def capacity(self) -> m.Capacity:
        return await self._model(m.Capacity, "GET", "/capacity")

    async def templates(self) -> list[m.TemplateInfo]:
        result: list[m.TemplateInfo] = self._parse(_TEMPLATES, await self._send("GET", "/templates"))
        return result

    async def metrics_text(self) -> bytes:
        return (await self._send("GET", "/metrics")).content

    # -- sandboxes -----------------------------------------------------------------------------------------------

    async def list_sandboxes(self) -> list[m.SandboxInfo]:
        result: list[m.SandboxInfo] = self._parse(_SANDBOXES, await self._send("GET", "/sandboxes"))
        return result

    async def create(self, spec: m.CreateSpec) -> m.SandboxInfo:
        return await self._model(m.SandboxInfo, "POST", "/sandboxes", json_body=spec.model_dump(mode="json"))

    async def get(self, sandbox_id: str) -> m.SandboxInfo:
        return await self._model(m.SandboxInfo, "GET", f"/sandboxes/{_q(sandbox_id)}")

    async def delete(self, sandbox_id: str) -> None:
        await self._send("DELETE", f"/sandboxes/{_q(sandbox_id)}")

    async def _action(self, sandbox_id: str, action: str) -> m.SandboxInfo:
        return await self._model(m.SandboxInfo, "POST", f"/sandboxes/{_q(sandbox_id)}/{action}")

    async def pause(self, sandbox_id: str) -> m.SandboxInfo:
        return await self._action(sandbox_id, "pause")

    async def resume(self, sandbox_id: str) -> m.SandboxInfo:
        return await self._action(sandbox_id, "resume")

    async def hibernate(self, sandbox_id: str) -> m.SandboxInfo:
        return await self._action(sandbox_id, "hibernate")

    async def wake(self, sandbox_id: str) -> m.SandboxInfo:
        return await self._action(sandbox_id, "wake")

    async def touch(self, sandbox_id: str) -> m.SandboxInfo:
        return await self._action(sandbox_id, "touch")

    async def store_hibernation(self, sandbox_id: str) -> m.StoredHibernation:
        path = f"/hibernations/{_q(sandbox_id)}/store"
        return await self._model(m.StoredHibernation, "POST", path, timeout=self._long())

    async def wake_stored(self, spec: m.WakeSpec) -> m.SandboxInfo:
        path = f"/hibernations/{_q(spec.sandbox_id)}/wake"
        body = spec.model_dump(mode="json")
        return await self._model(m.SandboxInfo, "POST", path, json_body=body, timeout=self._long())

    async def set_lifecycle(self, sandbox_id: str, patch: m.LifecyclePatch) -> m.SandboxInfo:
        path = f"/sandboxes/{_q(sandbox_id)}/lifecycle"
        return await self._model(m.SandboxInfo, "PATCH", path, json_body=patch.model_dump(mode="json"))

    # -- commands, files, terminals ------------------------------------------------------------------------------

    async def exec(self, sandbox_id: str, request: m.ExecRequest) -> m.ExecResult:
        path = f"/sandboxes/{_q(sandbox_id)}/exec"
        body = request.model_dump(mode="json")
        return await self._model(m.ExecResult, "POST", path, json_body=body, timeout=self._exec_timeout(request))

    def exec_stream(self, sandbox_id: str, request: m.ExecRequest) -> AsyncIterator[m.ExecEvent]:
        path = f"/sandboxes/{_q(sandbox_id)}/exec/stream"
        return self._stream(path, request, m.ExecEvent, self._exec_timeout(request))

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        response = await self._send("GET", f"/sandboxes/{_q(sandbox_id)}/files", params={"path": path})
        return response.content

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> m.WriteResult:
        url = f"/sandboxes/{_q(sandbox_id)}/files"
        params = {"path": path} if user is None else {"path": path, "user": user}
        return await self._model(m.WriteResult, "PUT", url, content=data, params=params)

    async def file_op(self, sandbox_id: str, op: str, path: str) -> m.FsReply:
        url = f"/sandboxes/{_q(sandbox_id)}/files/op"
        return await self._model(m.FsReply, "POST", url, json_body={"op": op, "path": path})

    async def inspect_net(self, sandbox_id: str) -> m.NetInspection:
        return await self._model(m.NetInspection, "GET", f"/sandboxes/{_q(sandbox_id)}/net")

    def pty_open(self, sandbox_id: str, request: m.PtyOpen) -> AsyncIterator[m.PtyEvent]:
        # a terminal may sit idle for as long as its user likes: no read timeout
        return self._stream(f"/sandboxes/{_q(sandbox_id)}/pty", request, m.PtyEvent, self._timeout(None))

    def _pty(self, sandbox_id: str, session: str, what: str) -> str:
        return f"/sandboxes/{_q(sandbox_id)}/pty/{_q(session)}/{what}"

    async def pty_input(self, sandbox_id: str, session: str, data: bytes) -> None:
        await self._send("POST", self._pty(sandbox_id, session, "input"), content=data)

    async def pty_resize(self, sandbox_id: str, session: str, cols: int, rows: int) -> None:
        await self._send("POST", self._pty(sandbox_id, session, "resize"), json_body={"cols": cols, "rows": rows})

    async def pty_close(self, sandbox_id: str, session: str) -> None:
        await self._send("POST", self._pty(sandbox_id, session, "close"))

    # -- snapshots and forks -------------------------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, request: m.SnapshotRequest) -> m.SnapshotInfo:
        path = f"/sandboxes/{_q(sandbox_id)}/snapshots"
        body = request.model_dump(mode="json")
        return await self._model(m.SnapshotInfo, "POST", path, json_body=body, timeout=self._long())

    async def store_snapshot(self, snapshot_id: str) -> m.StoredSnapshot:
        path = f"/snapshots/{_q(snapshot_id)}/store"
        return await self._model(m.StoredSnapshot, "POST", path, timeout=self._long())

    async def delete_snapshot(self, snapshot_id: str, *, from_store: bool = False) -> None:
        params = {"from_store": "true" if from_store else "false"}
        await self._send("DELETE", f"/snapshots/{_q(snapshot_id)}", params=params, timeout=self._long())

    async def prune_snapshots(self, keep: list[str]) -> list[str]:
        response = await self._send("POST", "/snapshots/prune", json_body={"keep": list(keep)}, timeout=self._long())
        body = self._parse(_OBJECT, response)
        removed = body.get("removed")
        if not isinstance(removed, list) or not all(isinstance(r, str) for r in removed):
            raise self._unexpected(response, ValueError("'removed' is not a list of ids"))
        return [str(r) for r in removed]

    async def fork(self, sandbox_id: str, request: m.ForkRequest) -> m.SandboxInfo:
        path = f"/sandboxes/{_q(sandbox_id)}/fork"
        body = request.model_dump(mode="json")
        return await self._model(m.SandboxInfo, "POST", path, json_body=body, timeout=self._long())

    async def fork_tree(self, sandbox_id: str, request: m.TreeRequest) -> m.TreeResult:
        path = f"/sandboxes/{_q(sandbox_id)}/fork-tree"
        body = request.model_dump(mode="json")
        return await self._model(m.TreeResult, "POST", path, json_body=body, timeout=self._long())

    async def evidence_list(self, snapshot_id: str) -> list[m.EvidenceEntry]:
        result: list[m.EvidenceEntry] = self._parse(
            _EVIDENCE, await self._send("GET", f"/snapshots/{_q(snapshot_id)}/evidence")
        )
        return result

    async def evidence_read(self, snapshot_id: str, name: str) -> bytes:
        return (await self._send("GET", f"/snapshots/{_q(snapshot_id)}/evidence/{_q(name)}")).content

    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int:
        response = await self._send("PUT", f"/snapshots/{_q(snapshot_id)}/evidence/{_q(name)}", content=data)
        written = self._parse(_OBJECT, response).get("bytes")
        if not isinstance(written, int):
            raise self._unexpected(response, ValueError("'bytes' is not an integer"))
        return written

    # -- templates -----------------------------------------------------------------------------------------------

    def build_template(self, build: m.TemplateBuild) -> AsyncIterator[m.BuildEvent]:
        # build steps can be silent for long stretches (a big pip install): no read timeout
        return self._stream("/templates", build, m.BuildEvent, self._timeout(None))

    async def remove_template(self, name: str) -> None:
        await self._send("DELETE", f"/templates/{_q(name)}")

    async def close(self) -> None:
        await self._client.aclose()


__all__ = ["HttpAgent", "error_from_response", "rebuild_error"]
