"""The agent HTTP server's routes for long-lived processes, watches and file-system calls (:mod:`.models_procs`).

Process and watch streams are NDJSON like every agent stream (:func:`~.http_streams.ndjson_response`); closing
one (the control plane's client went away) closes the agent's iterator, which detaches from the guest process
(it keeps running) or ends the watch.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse

from . import models as m
from .http_streams import ndjson_response
from .interface import Agent


def add_proc_routes(router: APIRouter, agent: Agent) -> None:
    base = "/sandboxes/{sandbox_id}"

    @router.post(base + "/procs/start", response_class=StreamingResponse)
    async def proc_start(sandbox_id: str, body: m.ProcStart) -> Response:
        return await ndjson_response(agent.proc_start(sandbox_id, body))

    @router.post(base + "/procs/connect", response_class=StreamingResponse)
    async def proc_connect(sandbox_id: str, body: m.ProcSelector) -> Response:
        return await ndjson_response(agent.proc_connect(sandbox_id, body))

    @router.get(base + "/procs")
    async def proc_list(sandbox_id: str) -> list[m.ProcInfo]:
        return await agent.proc_list(sandbox_id)

    @router.post(base + "/procs/input", status_code=204)
    async def proc_input(sandbox_id: str, body: m.ProcInput) -> Response:
        await agent.proc_input(sandbox_id, body)
        return Response(status_code=204)

    @router.post(base + "/procs/signal", status_code=204)
    async def proc_signal(sandbox_id: str, body: m.ProcSignal) -> Response:
        await agent.proc_signal(sandbox_id, body)
        return Response(status_code=204)

    @router.post(base + "/procs/resize", status_code=204)
    async def proc_resize(sandbox_id: str, body: m.ProcResize) -> Response:
        await agent.proc_resize(sandbox_id, body)
        return Response(status_code=204)

    @router.post(base + "/fs")
    async def fs(sandbox_id: str, body: m.FsRequest) -> m.FsReply:
        return await agent.fs(sandbox_id, body)

    @router.post(base + "/fs/watch", response_class=StreamingResponse)
    async def fs_watch(sandbox_id: str, body: m.WatchRequest) -> Response:
        return await ndjson_response(agent.fs_watch(sandbox_id, body))
