"""``GET /v1/sandboxes/{id}/pty`` (websocket): an interactive terminal in the sandbox.

Authentication: ``Authorization: Bearer <key>``, or ``?ticket=<ticket>`` from ``POST
/v1/sandboxes/{id}/pty/tickets`` (single use, 30 s; for browsers, which cannot set headers on a websocket). A
key in the query string (``?token=``) is refused: it would end up in access logs. Query parameters ``cols``,
``rows`` (initial size) and ``cmd`` (default: a login shell).

Messages, server to client: binary = terminal output; text = JSON control messages ``{"session": id}`` (once,
first), ``{"exit_code": n}`` (last, when the program exited) or ``{"error": message, "code": code}`` (then the
socket closes with code ``4000 + HTTP status``). Client to server: binary = terminal input; text = JSON
``{"resize": [cols, rows]}``, any other text is input. Disconnecting hangs the terminal up (SIGHUP).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError, InvalidArgument, Unauthorized
from ...util.encoding import unb64
from ..access.gate import bearer_key
from .deps import AppContext, Ctx
from .errors import ERROR_RESPONSES

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])

HANGUP_WAIT_S = 5.0  # how long to wait for the program to go after the client left


async def _workspace(websocket: WebSocket, ctx: AppContext, sandbox_id: str) -> str:
    if websocket.query_params.get("token"):
        raise Unauthorized("API keys in the URL are refused; send Authorization: Bearer <key> or use a ticket")
    ticket = websocket.query_params.get("ticket")
    if ticket:
        workspace_id = ctx.tickets.redeem(ticket, sandbox_id)
        if workspace_id is None:
            raise Unauthorized("invalid, used or expired terminal ticket")
        return workspace_id
    key = bearer_key(websocket.headers.get("authorization"))
    if key is None:
        raise Unauthorized("missing API key (Authorization: Bearer <key>) or terminal ticket (?ticket=)")
    workspace = await ctx.keys.check(key)
    if workspace is None:
        raise Unauthorized("invalid or revoked API key")
    return workspace.id


@router.post("/{sandbox_id}/pty/tickets", status_code=201, responses=ERROR_RESPONSES)
async def pty_ticket(sandbox_id: str, ctx: Ctx) -> dict[str, object]:
    """A single-use ticket for one terminal connection to this sandbox (``?ticket=`` on the websocket)."""
    await ctx.control.agent_for(sandbox_id, ctx.workspace_id)  # 404 for a sandbox the caller cannot see
    ticket = ctx.app.tickets.issue(ctx.workspace_id, sandbox_id)
    return {"ticket": ticket, "expires_in_s": ctx.app.tickets.ttl_s}


def _dimension(websocket: WebSocket, name: str, default: int) -> int:
    raw = websocket.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer") from None
    if not 1 <= value <= 10_000:
        raise InvalidArgument(f"{name} must be from 1 to 10000")
    return value


async def _send_error(websocket: WebSocket, error: CryoboxError) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(json.dumps({"error": error.message, "code": error.code}))
        await websocket.close(code=4000 + error.http_status, reason=error.code)


@router.websocket("/{sandbox_id}/pty")
async def pty(websocket: WebSocket, sandbox_id: str) -> None:
    ctx: AppContext = websocket.app.state.ctx
    await websocket.accept()
    try:
        workspace_id = await _workspace(websocket, ctx, sandbox_id)
        ctx.limiter.check(workspace_id)
        args: dict[str, Any] = {"cols": _dimension(websocket, "cols", 80), "rows": _dimension(websocket, "rows", 24)}
        if websocket.query_params.get("cmd"):
            args["cmd"] = websocket.query_params["cmd"]
        agent = await ctx.control.agent_for(sandbox_id, workspace_id)
    except CryoboxError as error:
        await _send_error(websocket, error)
        return
    await _Terminal(websocket, agent, sandbox_id).run(am.PtyOpen(**args))


class _Terminal:
    def __init__(self, websocket: WebSocket, agent: Agent, sandbox_id: str) -> None:
        self.ws = websocket
        self.agent = agent
        self.sandbox_id = sandbox_id
        self.session: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.exited = False

    async def run(self, args: am.PtyOpen) -> None:
        output = asyncio.create_task(self._output(args), name="pty-output")
        inputs = asyncio.create_task(self._input(), name="pty-input")
        try:
            await asyncio.wait({output, inputs}, return_when=asyncio.FIRST_COMPLETED)
            if not self.exited:  # the client went away (or the guest failed): hang the terminal up
                await self._hangup()
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(output), HANGUP_WAIT_S)
            with contextlib.suppress(Exception):
                await self.ws.close()
        finally:
            for task in (output, inputs):
                task.cancel()
            for task in (output, inputs):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _hangup(self) -> None:
        if not self.session.done() or self.session.cancelled():
            return
        with contextlib.suppress(CryoboxError):
            await self.agent.pty_close(self.sandbox_id, self.session.result())

    async def _output(self, args: am.PtyOpen) -> None:
        try:
            async for event in self.agent.pty_open(self.sandbox_id, args):
                if event.kind == "session":
                    self.session.set_result(event.text)
                    await self.ws.send_text(json.dumps({"session": event.text}))
                elif event.kind == "output":
                    await self.ws.send_bytes(unb64(event.data_b64))
                elif event.kind == "exit":
                    self.exited = True
                    await self.ws.send_text(json.dumps({"exit_code": event.exit_code}))
        except CryoboxError as error:
            if not self.session.done():
                self.session.cancel()
            await _send_error(self.ws, error)
        except (WebSocketDisconnect, RuntimeError):  # the client left while output was on its way
            pass

    async def _input(self) -> None:
        session = await self.session
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data: bytes | None = message.get("bytes")
            text: str | None = message.get("text")
            if data is None and text is not None:
                resize = _resize(text)
                if resize is not None:
                    cols, rows = resize
                    with contextlib.suppress(CryoboxError):
                        await self.agent.pty_resize(self.sandbox_id, session, cols, rows)
                    continue
                data = text.encode()
            if data:
                try:
                    await self.agent.pty_input(self.sandbox_id, session, data)
                except CryoboxError as error:
                    log.debug("pty input to %s dropped: %s", session, error)


def _resize(text: str) -> tuple[int, int] | None:
    """``(cols, rows)`` if ``text`` is a ``{"resize": [cols, rows]}`` message, else None."""
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or "resize" not in value:
        return None
    size = value["resize"]
    if (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10_000 for v in size)
    ):
        return size[0], size[1]
    return None
