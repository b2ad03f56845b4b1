"""envd's ``process.Process`` service, served by the control plane on the agent's process calls.

Each call opens its sandbox from the request's headers (:func:`~.session.open_target`), then maps onto
``proc_start`` / ``proc_connect`` / ``proc_list`` / ``proc_input`` / ``proc_signal`` / ``proc_resize``
(:mod:`.procmap` holds the message mapping). Streams carry keepalives in quiet gaps and close the agent's
iterator when they end for any reason: the guest detaches and the process keeps running.

Like envd, a ``Start`` with a deadline (``Connect-Timeout-Ms``: the SDK's ``timeout``, 60 s by default, 0 for
none) kills the process with SIGKILL when the deadline passes, whether or not anyone still listens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from connectrpc.request import RequestContext
from protobuf import Oneof

from ....agentapi import models_procs as mp
from ....errors import CryoboxError, InvalidArgument
from . import procmap
from .gen.process import process_pb as pb
from .gen.process.process_connect import Process
from .session import DEFAULT_USER, SandboxOpener, Target, open_target
from .streams import keepalive_interval, with_keepalive

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class ProcessService(Process):
    def __init__(
        self, opener: SandboxOpener, *, default_user: str = DEFAULT_USER, sleep: Sleep = asyncio.sleep
    ) -> None:
        self._opener = opener
        self._default_user = default_user
        self._sleep = sleep
        self._kills: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        """Forget the pending deadline kills (at shutdown: the guest keeps its processes)."""
        for task in list(self._kills):
            task.cancel()
        if self._kills:
            await asyncio.wait(set(self._kills))

    async def _target(self, ctx: RequestContext[Any, Any]) -> Target:
        return await open_target(self._opener, ctx.request_headers, default_user=self._default_user)

    # -- streams -------------------------------------------------------------------------------------------
    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[pb.StartRequest, pb.StartResponse], /
    ) -> AsyncIterator[pb.StartResponse]:
        target = await self._target(ctx)
        spec = procmap.start_spec(request, target)
        deadline_ms = ctx.timeout_ms
        kill: asyncio.Task[None] | None = None
        async with self._events(target.agent.proc_start(target.sandbox_id, spec), ctx) as events:
            async for event in events:
                if event is None:
                    yield pb.StartResponse(event=procmap.keepalive())
                    continue
                if event.kind == "start" and event.pid is not None and deadline_ms is not None:
                    kill = self._kill_later(target, event.pid, max(deadline_ms, 0.0) / 1000)
                if event.kind == "end" and kill is not None:
                    kill.cancel()
                yield pb.StartResponse(event=procmap.process_event(event))
                if event.kind == "end":
                    return

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[pb.ConnectRequest, pb.ConnectResponse], /
    ) -> AsyncIterator[pb.ConnectResponse]:
        target = await self._target(ctx)
        process = procmap.selector(request.process)
        async with self._events(target.agent.proc_connect(target.sandbox_id, process), ctx) as events:
            async for event in events:
                if event is None:
                    yield pb.ConnectResponse(event=procmap.keepalive())
                    continue
                yield pb.ConnectResponse(event=procmap.process_event(event))
                if event.kind == "end":
                    return

    def _events(
        self, source: AsyncIterator[mp.ProcEvent], ctx: RequestContext[Any, Any]
    ) -> aclosing[AsyncGenerator[mp.ProcEvent | None, None]]:
        """The agent's events with keepalives; leaving the ``async with`` closes the agent's stream."""
        # the SDK takes a stream's first event for the start event: no keepalive before it
        return aclosing(with_keepalive(source, keepalive_interval(ctx.request_headers), quiet_until_first=True))

    def _kill_later(self, target: Target, pid: int, delay_s: float) -> asyncio.Task[None]:
        task = asyncio.create_task(self._kill_at(target, pid, delay_s), name=f"envd-deadline-{pid}")
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        return task

    async def _kill_at(self, target: Target, pid: int, delay_s: float) -> None:
        await self._sleep(delay_s)
        request = mp.ProcSignal(process=mp.ProcSelector(pid=pid), signal=procmap.SIGKILL)
        try:
            await target.agent.proc_signal(target.sandbox_id, request)
        except CryoboxError as err:  # ended meanwhile (not found), or the sandbox went away
            log.debug("deadline kill of %s in %s: %s", pid, target.sandbox_id, err.message)
        except Exception:
            log.exception("deadline kill of %s in %s failed", pid, target.sandbox_id)

    # -- unary ---------------------------------------------------------------------------------------------
    async def list(
        self, request: pb.ListRequest, ctx: RequestContext[pb.ListRequest, pb.ListResponse], /
    ) -> pb.ListResponse:
        target = await self._target(ctx)
        infos = await target.agent.proc_list(target.sandbox_id)
        return pb.ListResponse(processes=[procmap.process_info(info) for info in infos if info.running])

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[pb.SendInputRequest, pb.SendInputResponse], /
    ) -> pb.SendInputResponse:
        target = await self._target(ctx)
        process = procmap.selector(request.process)
        data = procmap.input_bytes(request.input)
        await self._input(target, process, data)
        return pb.SendInputResponse()

    async def stream_input(
        self,
        request: AsyncIterator[pb.StreamInputRequest],
        ctx: RequestContext[pb.StreamInputRequest, pb.StreamInputResponse],
        /,
    ) -> pb.StreamInputResponse:
        target = await self._target(ctx)
        process: mp.ProcSelector | None = None
        async for message in request:  # one at a time: the guest sees the chunks in the order they were sent
            match message.event:
                case Oneof(field="start", value=pb.StreamInputRequest.StartEvent() as start):
                    process = procmap.selector(start.process)
                case Oneof(field="data", value=pb.StreamInputRequest.DataEvent() as data):
                    if process is None:
                        raise InvalidArgument("the input stream must start with a start event naming the process")
                    await self._input(target, process, procmap.input_bytes(data.input))
                case Oneof(field="keepalive"):
                    pass
                case _:
                    raise InvalidArgument("unknown input stream event")
        return pb.StreamInputResponse()

    async def _input(self, target: Target, process: mp.ProcSelector, data: bytes) -> None:
        for chunk in procmap.input_requests(process, data):
            await target.agent.proc_input(target.sandbox_id, chunk)

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[pb.CloseStdinRequest, pb.CloseStdinResponse], /
    ) -> pb.CloseStdinResponse:
        target = await self._target(ctx)
        process = procmap.selector(request.process)
        await target.agent.proc_input(target.sandbox_id, mp.ProcInput(process=process, eof=True))
        return pb.CloseStdinResponse()

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse], /
    ) -> pb.SendSignalResponse:
        target = await self._target(ctx)
        process = procmap.selector(request.process)
        signal = procmap.signal_number(request.signal)
        await target.agent.proc_signal(target.sandbox_id, mp.ProcSignal(process=process, signal=signal))
        return pb.SendSignalResponse()

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[pb.UpdateRequest, pb.UpdateResponse], /
    ) -> pb.UpdateResponse:
        target = await self._target(ctx)
        process = procmap.selector(request.process)
        size = procmap.pty_size(request.pty)
        if size is not None:
            await target.agent.proc_resize(target.sandbox_id, mp.ProcResize(process=process, size=size))
        return pb.UpdateResponse()
