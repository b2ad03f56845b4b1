"""Background processes (``/v1/sandboxes/{id}/processes``) and directory watches (``…/fs/watch``).

A process started here lives in the guest independently of any request: the start route detaches from it once
the guest reported its pid, and a stream or wait that ends (or whose client goes away) only detaches too. Its
output is kept in a bounded buffer in the guest, so a later stream or wait replays what it printed so far.
Streams are server-sent events in the style of ``exec/stream``: an error before the first event is a plain error
response, one after it an ``error`` event. Closing an event stream closes the agent stream it reads (so a guest
watch ends with its client).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import json
import shlex
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ... import models
from ...agentapi import models as am
from ...errors import CryoboxError, GuestError, InvalidArgument, PayloadTooLarge, SandboxTimeout
from ...models.procs import MAX_INPUT_B64
from ...util.times import rfc3339
from .deps import Ctx
from .errors import ERROR_RESPONSES
from .files import PathQuery, checked

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}", responses=ERROR_RESPONSES)

SHELL = "/bin/sh"
SIGKILL = 9
MAX_WAIT_OUTPUT = 16 << 20
"""Characters of stdout (and of stderr) one ``wait`` answer keeps; the rest is dropped (``truncated``)."""
SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}
}
OUTPUT_KINDS = ("stdout", "stderr", "pty")
Pid = Annotated[int, Path(ge=1, le=2**31 - 1, description="the process id in the guest")]
T = TypeVar("T")


# --- helpers ---------------------------------------------------------------------------------------------------


def sse(event: str, data: dict[str, object]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def aclose(stream: AsyncIterator[Any]) -> None:
    """Close an agent stream (a no-op for one that already ended)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def first_item(stream: AsyncIterator[T]) -> T | None:
    """The stream's first item (``None``: it was empty); closes the stream if that fails."""
    try:
        return await anext(aiter(stream))
    except StopAsyncIteration:
        return None
    except BaseException:
        await aclose(stream)
        raise


class EventStream(StreamingResponse):
    """``text/event-stream`` of ``content``, closing the agent stream ``source`` when the response ends however
    it ends (finished, failed, or the client went away before or during the body)."""

    def __init__(self, content: AsyncIterator[bytes], source: AsyncIterator[Any]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await aclose(self._source)


class Output:
    """A process's output streams decoded as UTF-8 incrementally, each on its own (``errors="replace"``): a
    character split across two chunks comes out whole."""

    def __init__(self) -> None:
        self._decoders = {kind: codecs.getincrementaldecoder("utf-8")(errors="replace") for kind in OUTPUT_KINDS}

    def decode(self, event: am.ProcEvent) -> str:
        try:
            data = base64.b64decode(event.data_b64)
        except (binascii.Error, ValueError) as err:
            raise GuestError(f"the guest sent malformed {event.kind} data for process {event.pid}") from err
        return self._decoders[event.kind].decode(data)

    def flush(self) -> list[tuple[str, str]]:
        """What is left in each decoder (an incomplete character at the end: U+FFFD)."""
        rest = [(kind, decoder.decode(b"", final=True)) for kind, decoder in self._decoders.items()]
        return [(kind, text) for kind, text in rest if text]


def shell_cmd(info: am.ProcInfo) -> str:
    """The command as the caller gave it: the shell string of ``/bin/sh -c``, else the argv quoted for a shell."""
    if info.cmd == SHELL and len(info.args) == 2 and info.args[0] == "-c":
        return info.args[1]
    return shlex.join([info.cmd, *info.args])


def process_view(info: am.ProcInfo) -> models.Process:
    return models.Process(
        pid=info.pid,
        tag=info.tag,
        cmd=shell_cmd(info),
        running=info.running,
        exit_code=info.exit_code,
        started_at=rfc3339(info.started_at),
    )


def ended_without_exit(pid: int, event: am.ProcEvent | None) -> GuestError:
    if event is not None and event.error:
        return GuestError(f"process {pid} failed: {event.error}", details={"pid": pid, "status": event.status})
    return GuestError(f"the stream of process {pid} ended before the process reported an exit code")


# --- processes -------------------------------------------------------------------------------------------------


@router.post("/processes", status_code=201, response_model=models.Process, tags=["processes"])
async def start_process(sandbox_id: str, body: models.ProcessStartRequest, ctx: Ctx) -> models.Process:
    """Start ``cmd`` with ``/bin/sh -c`` in the background; answers once the guest reported its pid. The process
    keeps running after this answer: follow it with ``…/stream``, collect it with ``…/wait``."""
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    spec = am.ProcStart(
        cmd=SHELL,
        args=["-c", body.cmd],
        env=body.env,
        cwd=body.cwd,
        tag=body.tag,
        stdin=body.stdin,
        pty=am.PtySize(cols=body.pty.cols, rows=body.pty.rows) if body.pty is not None else None,
    )
    started_at = time.time()
    stream = agent.proc_start(sandbox_id, spec)
    first = await first_item(stream)
    await aclose(stream)  # detaches: the process keeps running
    if first is None or first.kind != "start" or first.pid is None:
        raise GuestError("the guest did not report the started process's pid", details={"cmd": body.cmd})
    return models.Process(
        pid=first.pid, tag=body.tag, cmd=body.cmd, running=True, exit_code=None, started_at=rfc3339(started_at)
    )


@router.get("/processes", response_model=models.ProcessList, tags=["processes"])
async def list_processes(sandbox_id: str, ctx: Ctx) -> models.ProcessList:
    """The guest's processes started through this API (or E2B's), running ones and recently ended ones."""
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    return models.ProcessList(items=[process_view(info) for info in await agent.proc_list(sandbox_id)])


@router.get("/processes/{pid}/stream", response_class=StreamingResponse, responses=SSE_DOC, tags=["processes"])
async def stream_process(sandbox_id: str, pid: Pid, ctx: Ctx) -> StreamingResponse:
    """What the process printed so far, then its live output: ``stdout``/``stderr`` (``{"chunk": text}``), ``pty``
    (``{"data_b64": …}``), then one ``exit`` (``{"exit_code", "status"}``) or ``error`` (``{"error", "code"}``).
    ``dropped`` (when present) counts the bytes the guest's buffer discarded before that chunk. Closing the
    stream only detaches."""
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    stream = agent.proc_connect(sandbox_id, am.ProcSelector(pid=pid))
    first = await first_item(stream)  # an unknown pid is a plain 404

    async def events() -> AsyncIterator[bytes]:
        output = Output()
        try:
            if first is not None:
                async for event in _chain(first, stream):
                    if event.kind == "start":
                        continue
                    if event.kind == "end":
                        for kind, rest in output.flush():
                            yield sse(kind, {"chunk": rest})
                        if event.exit_code is None:
                            raise ended_without_exit(pid, event)
                        yield sse("exit", {"exit_code": event.exit_code, "status": event.status})
                        return
                    extra: dict[str, object] = {"dropped": event.dropped} if event.dropped else {}
                    if event.kind == "pty":
                        yield sse("pty", {"data_b64": event.data_b64, **extra})
                    elif chunk := output.decode(event):
                        yield sse(event.kind, {"chunk": chunk, **extra})
            raise ended_without_exit(pid, None)
        except CryoboxError as err:
            yield sse("error", {"error": err.message, "code": err.code})

    return EventStream(events(), stream)


async def _chain(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


def _input_b64(body: models.ProcessInput) -> str:
    if body.data_b64 is not None:
        try:
            raw = base64.b64decode(body.data_b64, validate=True)
        except (binascii.Error, ValueError) as err:
            raise InvalidArgument("data_b64 is not valid base64") from err
    else:
        raw = (body.data or "").encode()
    encoded = base64.b64encode(raw).decode()
    if len(encoded) > MAX_INPUT_B64:
        limit = MAX_INPUT_B64 // 4 * 3
        raise PayloadTooLarge(f"stdin data of {len(raw)} bytes exceeds {limit}", details={"limit": limit})
    return encoded


@router.post("/processes/{pid}/stdin", status_code=204, response_class=Response, tags=["processes"])
async def process_stdin(sandbox_id: str, pid: Pid, body: models.ProcessInput, ctx: Ctx) -> Response:
    """Write ``data`` (UTF-8) or ``data_b64`` to the process's stdin (or terminal); ``eof`` closes its stdin pipe.
    A process started without ``stdin`` (or one that ended) refuses input."""
    data_b64 = _input_b64(body)
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    await agent.proc_input(sandbox_id, am.ProcInput(process=am.ProcSelector(pid=pid), data_b64=data_b64, eof=body.eof))
    return Response(status_code=204)


@router.post("/processes/{pid}/signal", status_code=204, response_class=Response, tags=["processes"])
async def signal_process(sandbox_id: str, pid: Pid, body: models.ProcessSignal, ctx: Ctx) -> Response:
    """Send ``signal`` (a number 1-64 or a name: ``SIGTERM``, ``TERM``, ``KILL``…) to the process's group."""
    await _signal(ctx, sandbox_id, pid, body.signal)
    return Response(status_code=204)


@router.delete("/processes/{pid}", status_code=204, response_class=Response, tags=["processes"])
async def kill_process(sandbox_id: str, pid: Pid, ctx: Ctx) -> Response:
    """SIGKILL the process."""
    await _signal(ctx, sandbox_id, pid, SIGKILL)
    return Response(status_code=204)


async def _signal(ctx: Ctx, sandbox_id: str, pid: int, signal: int) -> None:
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    await agent.proc_signal(sandbox_id, am.ProcSignal(process=am.ProcSelector(pid=pid), signal=signal))


class Collected:
    """The output ``wait`` gathers: stdout (a terminal's output too) and stderr, up to ``limit`` characters each."""

    def __init__(self, pid: int, limit: int = MAX_WAIT_OUTPUT) -> None:
        self.pid = pid
        self._limit = limit
        self._output = Output()
        self._parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._sizes = {"stdout": 0, "stderr": 0}
        self.truncated = False

    def _add(self, kind: str, text: str) -> None:
        target = "stderr" if kind == "stderr" else "stdout"
        room = self._limit - self._sizes[target]
        if len(text) > room:
            text, self.truncated = text[: max(room, 0)], True
        self._parts[target].append(text)
        self._sizes[target] += len(text)

    def feed(self, event: am.ProcEvent) -> None:
        if event.kind in OUTPUT_KINDS:
            self._add(event.kind, self._output.decode(event))

    def text(self, kind: str) -> str:
        return "".join(self._parts[kind])

    def finish(self, end: am.ProcEvent) -> models.ProcessResult:
        for kind, rest in self._output.flush():
            self._add(kind, rest)
        if end.exit_code is None:
            raise ended_without_exit(self.pid, end)
        return models.ProcessResult(
            pid=self.pid,
            exit_code=end.exit_code,
            status=end.status,
            stdout=self.text("stdout"),
            stderr=self.text("stderr"),
            truncated=self.truncated,
        )


@router.post("/processes/{pid}/wait", response_model=models.ProcessResult, tags=["processes"])
async def wait_process(
    sandbox_id: str,
    pid: Pid,
    ctx: Ctx,
    timeout_seconds: Annotated[float | None, Query(gt=0, le=24 * 3600)] = None,
) -> models.ProcessResult:
    """Wait for the process to end; everything it printed (replayed from the start of the guest's buffer) and how
    it ended. Past ``timeout_seconds``: 504 ``timeout`` with the output so far in ``details``; the process keeps
    running."""
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    collected = Collected(pid)
    stream = agent.proc_connect(sandbox_id, am.ProcSelector(pid=pid))
    try:
        async with asyncio.timeout(timeout_seconds) as deadline:
            async for event in stream:
                if event.kind == "end":
                    return collected.finish(event)
                collected.feed(event)
    except TimeoutError:
        if not deadline.expired():
            raise
        raise SandboxTimeout(
            f"waiting for process {pid} timed out after {timeout_seconds}s (the process keeps running)",
            details={
                "pid": pid,
                "stdout": collected.text("stdout"),
                "stderr": collected.text("stderr"),
                "timeout_seconds": timeout_seconds,
            },
        ) from None
    finally:
        await aclose(stream)
    raise ended_without_exit(pid, None)


# --- directory watches -----------------------------------------------------------------------------------------


@router.get("/fs/watch", response_class=StreamingResponse, responses=SSE_DOC, tags=["files"])
async def watch_dir(sandbox_id: str, ctx: Ctx, path: str = PathQuery, recursive: bool = False) -> StreamingResponse:
    """Changes under the directory ``path`` as server-sent events ``{"kind", "name"}``: ``start`` once the watch
    is in place, then ``create``, ``write``, ``remove``, ``rename`` or ``chmod`` of ``name`` (relative to ``path``),
    until the client closes the stream (which ends the watch in the guest); a failure is an ``error`` event."""
    checked(path)
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    stream = agent.fs_watch(sandbox_id, am.WatchRequest(path=path, recursive=recursive))
    first = await first_item(stream)  # a missing directory is a plain 404

    async def events() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                async for event in _chain(first, stream):
                    yield sse(event.kind, {"kind": event.kind, "name": event.name})
            raise GuestError(f"the watch of {path} ended")
        except CryoboxError as err:
            yield sse("error", {"error": err.message, "code": err.code})

    return EventStream(events(), stream)
