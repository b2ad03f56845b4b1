""":class:`~.http_client.HttpAgent`'s methods for long-lived processes, watches, file-system calls and ports.

A port's traffic does not go through these calls: :meth:`ProcClient.port_target` names the agent's own port
route (``/agent/v1/sandboxes/<id>/ports/<port>``, node token attached), which proxies to the guest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from ..errors import InvalidArgument
from . import models as m

M = TypeVar("M", bound=BaseModel)
_PROCS = TypeAdapter(list[m.ProcInfo])
PREFIX = "/agent/v1"


def _q(segment: str) -> str:
    return quote(segment, safe="")


class ProcClient:
    """Mixed into ``HttpAgent``, whose plumbing (``_send``, ``_stream``, ``_parse``, ``_timeout``) it uses."""

    url: str
    _token: str

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
        raise NotImplementedError  # HttpAgent's

    def _stream(self, path: str, body: BaseModel, model: type[M], timeout: httpx.Timeout) -> AsyncIterator[M]:
        raise NotImplementedError  # HttpAgent's

    def _parse(self, adapter: TypeAdapter[Any] | type[BaseModel], response: httpx.Response) -> Any:
        raise NotImplementedError  # HttpAgent's

    def _timeout(self, read_s: float | None) -> httpx.Timeout:
        raise NotImplementedError  # HttpAgent's

    def proc_start(self, sandbox_id: str, request: m.ProcStart) -> AsyncIterator[m.ProcEvent]:
        # a process may stay quiet as long as it likes: no read timeout
        return self._stream(f"/sandboxes/{_q(sandbox_id)}/procs/start", request, m.ProcEvent, self._timeout(None))

    def proc_connect(self, sandbox_id: str, process: m.ProcSelector) -> AsyncIterator[m.ProcEvent]:
        path = f"/sandboxes/{_q(sandbox_id)}/procs/connect"
        return self._stream(path, process, m.ProcEvent, self._timeout(None))

    async def proc_list(self, sandbox_id: str) -> list[m.ProcInfo]:
        result: list[m.ProcInfo] = self._parse(_PROCS, await self._send("GET", f"/sandboxes/{_q(sandbox_id)}/procs"))
        return result

    async def _post(self, sandbox_id: str, what: str, body: BaseModel) -> httpx.Response:
        path = f"/sandboxes/{_q(sandbox_id)}/{what}"
        return await self._send("POST", path, json_body=body.model_dump(mode="json"))

    async def proc_input(self, sandbox_id: str, request: m.ProcInput) -> None:
        await self._post(sandbox_id, "procs/input", request)

    async def proc_signal(self, sandbox_id: str, request: m.ProcSignal) -> None:
        await self._post(sandbox_id, "procs/signal", request)

    async def proc_resize(self, sandbox_id: str, request: m.ProcResize) -> None:
        await self._post(sandbox_id, "procs/resize", request)

    async def fs(self, sandbox_id: str, request: m.FsRequest) -> m.FsReply:
        result: m.FsReply = self._parse(m.FsReply, await self._post(sandbox_id, "fs", request))
        return result

    def fs_watch(self, sandbox_id: str, request: m.WatchRequest) -> AsyncIterator[m.FsEvent]:
        return self._stream(f"/sandboxes/{_q(sandbox_id)}/fs/watch", request, m.FsEvent, self._timeout(None))

    async def port_target(self, sandbox_id: str, port: int) -> m.PortTarget:
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be 1-65535, got {port}", details={"port": port})
        return m.PortTarget(
            url=f"{self.url}{PREFIX}/sandboxes/{_q(sandbox_id)}/ports/{port}",
            headers={"Authorization": f"Bearer {self._token}"},
        )
