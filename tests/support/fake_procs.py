"""The process, watch, file-system and port methods of :class:`~.fake_agent.FakeAgent`, in memory.

A fake process's behaviour comes from its ``cmd``: ``echo`` prints its args and ends (exit 0); ``cat`` prints
back every input until end of input (exit 0); ``fail`` prints ``bad`` to stderr and ends with exit 3; anything
else runs until signalled (exit -1, ``signal: <n>``). Streams detach (the process keeps running) when closed.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from cryobox.agentapi import models as m
from cryobox.errors import InvalidArgument, NotFound


@dataclass
class FakeProc:
    info: m.ProcInfo
    output: list[m.ProcEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: m.ProcEvent | None = None

    def emit(self, event: m.ProcEvent) -> None:
        if event.kind == "end":
            self.ended = event
            self.info = self.info.model_copy(update={"running": False, "exit_code": event.exit_code})
        else:
            self.output.append(event)
        self.changed.set()


class FakeProcs:
    """Mixed into ``FakeAgent`` (whose ``_record``/``_guest`` and ``sandboxes`` it uses)."""

    def _record(self, method: str, *args: object) -> None:
        raise NotImplementedError

    def _guest(self, sandbox_id: str) -> m.SandboxInfo:
        raise NotImplementedError

    def _init_procs(self) -> None:
        self.procs: dict[str, dict[int, FakeProc]] = {}
        self.proc_streams_closed = 0
        self.watch_queues: dict[str, asyncio.Queue[m.FsEvent]] = {}
        self.fs_calls: list[m.FsRequest] = []
        self.port_url = "http://127.0.0.1:9"
        self._pids = itertools.count(100)

    def _proc(self, sandbox_id: str, process: m.ProcSelector) -> FakeProc:
        for proc in self.procs.get(sandbox_id, {}).values():
            if proc.info.pid == process.pid or (process.tag is not None and proc.info.tag == process.tag):
                return proc
        raise NotFound(f"no process {process.pid or process.tag}")

    async def _follow(self, proc: FakeProc) -> AsyncIterator[m.ProcEvent]:
        try:
            yield m.ProcEvent(kind="start", pid=proc.info.pid)
            sent = 0
            while True:
                while sent < len(proc.output):
                    yield proc.output[sent]
                    sent += 1
                if proc.ended is not None:
                    yield proc.ended
                    return
                proc.changed.clear()
                await proc.changed.wait()
        finally:
            self.proc_streams_closed += 1

    async def proc_start(self, sandbox_id: str, request: m.ProcStart) -> AsyncIterator[m.ProcEvent]:
        self._record("proc_start", sandbox_id, request)
        self._guest(sandbox_id)
        pid = next(self._pids)
        info = m.ProcInfo(
            pid=pid, tag=request.tag, cmd=request.cmd, args=request.args, env=request.env, cwd=request.cwd
        )
        proc = FakeProc(info=info)
        self.procs.setdefault(sandbox_id, {})[pid] = proc
        if request.cmd == "echo":
            proc.emit(m.ProcEvent(kind="stdout", pid=pid, data_b64=_b64(" ".join(request.args) + "\n")))
            proc.emit(m.ProcEvent(kind="end", pid=pid, exit_code=0, status="exit status 0"))
        elif request.cmd == "fail":
            proc.emit(m.ProcEvent(kind="stderr", pid=pid, data_b64=_b64("bad\n")))
            proc.emit(m.ProcEvent(kind="end", pid=pid, exit_code=3, status="exit status 3"))
        async for event in self._follow(proc):
            yield event

    async def proc_connect(self, sandbox_id: str, process: m.ProcSelector) -> AsyncIterator[m.ProcEvent]:
        self._record("proc_connect", sandbox_id, process)
        self._guest(sandbox_id)
        proc = self._proc(sandbox_id, process)
        async for event in self._follow(proc):
            yield event

    async def proc_list(self, sandbox_id: str) -> list[m.ProcInfo]:
        self._record("proc_list", sandbox_id)
        self._guest(sandbox_id)
        return [p.info for p in self.procs.get(sandbox_id, {}).values()]

    def _live(self, sandbox_id: str, process: m.ProcSelector) -> FakeProc:
        proc = self._proc(sandbox_id, process)
        if proc.ended is not None:
            raise NotFound(f"process {proc.info.pid} has ended")
        return proc

    async def proc_input(self, sandbox_id: str, request: m.ProcInput) -> None:
        self._record("proc_input", sandbox_id, request)
        self._guest(sandbox_id)
        proc = self._live(sandbox_id, request.process)
        if proc.info.cmd != "cat":
            raise InvalidArgument(f"process {proc.info.pid} takes no input")
        if request.data_b64:
            proc.emit(m.ProcEvent(kind="stdout", pid=proc.info.pid, data_b64=request.data_b64))
        if request.eof:
            proc.emit(m.ProcEvent(kind="end", pid=proc.info.pid, exit_code=0, status="exit status 0"))

    async def proc_signal(self, sandbox_id: str, request: m.ProcSignal) -> None:
        self._record("proc_signal", sandbox_id, request)
        self._guest(sandbox_id)
        proc = self._live(sandbox_id, request.process)
        proc.emit(m.ProcEvent(kind="end", pid=proc.info.pid, exit_code=-1, status=f"signal: {request.signal}"))

    async def proc_resize(self, sandbox_id: str, request: m.ProcResize) -> None:
        self._record("proc_resize", sandbox_id, request)
        self._guest(sandbox_id)
        self._live(sandbox_id, request.process)

    async def fs(self, sandbox_id: str, request: m.FsRequest) -> m.FsReply:
        self._record("fs", sandbox_id, request)
        self._guest(sandbox_id)
        self.fs_calls.append(request)
        if request.op == "move":
            return m.FsReply(path=request.destination or "", name=(request.destination or "").rsplit("/", 1)[-1])
        return m.FsReply.model_validate({"op": request.op, "path": request.path, "depth": request.depth})

    async def fs_watch(self, sandbox_id: str, request: m.WatchRequest) -> AsyncIterator[m.FsEvent]:
        self._record("fs_watch", sandbox_id, request)
        self._guest(sandbox_id)
        queue: asyncio.Queue[m.FsEvent] = asyncio.Queue()
        self.watch_queues[sandbox_id] = queue
        try:
            yield m.FsEvent(kind="start")
            while True:
                yield await queue.get()
        finally:
            self.watch_queues.pop(sandbox_id, None)

    async def port_target(self, sandbox_id: str, port: int) -> m.PortTarget:
        self._record("port_target", sandbox_id, port)
        self._guest(sandbox_id)
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be 1-65535, got {port}")
        return m.PortTarget(url=f"{self.port_url}/{port}")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
