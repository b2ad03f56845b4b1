"""Fakes for the envd tests: a sandbox opener, an in-memory agent (processes, files, watches) and a live server.

``FakeEnvdAgent`` implements the agent's process and file-system methods in memory. A process behaves by its
``cmd`` (for ``/bin/bash -l -c SCRIPT``, the SDK's ``commands.run``, by the script's first word):
``echo`` prints its args; ``cat`` prints back its input until end of input; ``fail`` prints ``bad`` to stderr and
exits 3; ``exit N`` exits N; anything else (``sleep``) runs until signalled. Every stream the agent hands out
counts its closes in ``closed_streams``.

``serve`` runs an app under uvicorn on 127.0.0.1 (a free port) in the test's own loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import posixpath
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from cryobox.agentapi import models_procs as mp
from cryobox.agentapi.interface import Agent
from cryobox.agentapi.models import FsReply, WriteResult
from cryobox.compat.e2b import signing
from cryobox.errors import InvalidArgument, NotFound, StateError, Unauthorized
from cryobox.netpolicy import EgressPolicy

SANDBOX = "sbx-1"
TOKEN = "token-1"
HEADERS = {"E2b-Sandbox-Id": SANDBOX, "E2b-Sandbox-Port": "49983", "X-Access-Token": TOKEN}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- the opener ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    status: str = "running"
    egress: EgressPolicy | None = None


class FakeAccess:
    """Like ``SandboxAccess.open``: ``tokens`` maps sandbox ids to their tokens; ``gone`` ones are 404s; a signed
    file URL without a token is checked with :func:`cryobox.compat.e2b.signing.check` on ``clock``."""

    def __init__(self, agent: FakeEnvdAgent, status: str = "running") -> None:
        self.agent = agent
        self.tokens = {SANDBOX: TOKEN, "sbx-gone": "token-gone"}
        self.gone = {"sbx-gone"}
        self.status = status
        self.egress: EgressPolicy | None = None
        """The network policy the opened sandbox's row has."""
        self.opened: list[tuple[str | None, bool]] = []
        self.clock = time.time

    async def open(
        self,
        sandbox_id: str | None,
        token: str | None,
        *,
        wake: bool = True,
        traffic: bool = False,
        signed: signing.FileSignature | None = None,
    ) -> tuple[Row, Agent]:
        if not sandbox_id:
            raise InvalidArgument("missing the E2b-Sandbox-Id header")
        if signed is not None and not token:
            known = [self.tokens[sandbox_id]] if sandbox_id in self.tokens else []
            signing.check(signed, known, self.clock())
        elif not token or self.tokens.get(sandbox_id) != token:
            raise Unauthorized("missing or invalid sandbox access token (X-Access-Token)")
        if sandbox_id in self.gone:
            raise NotFound(f"sandbox {sandbox_id} not found")
        self.opened.append((sandbox_id, wake))
        return Row(self.status, self.egress), cast(Agent, self.agent)


# -- processes -----------------------------------------------------------------------------------------------
@dataclass
class FakeProc:
    info: mp.ProcInfo
    behaviour: str
    output: list[mp.ProcEvent] = field(default_factory=list)
    ended: mp.ProcEvent | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    inputs: list[bytes] = field(default_factory=list)

    def emit(self, event: mp.ProcEvent) -> None:
        if self.ended is not None:
            return
        if event.kind == "end":
            self.ended = event
            self.info = self.info.model_copy(update={"running": False, "exit_code": event.exit_code})
        else:
            self.output.append(event)
        self.changed.set()

    def out(self, kind: str, data: bytes) -> None:
        kind = "pty" if self.info.pty and kind == "stdout" else kind
        self.emit(mp.ProcEvent.model_validate({"kind": kind, "pid": self.info.pid, "data_b64": b64(data)}))

    def exit(self, code: int) -> None:
        self.emit(mp.ProcEvent(kind="end", pid=self.info.pid, exit_code=code, status=f"exit status {code}"))


def _behaviour(request: mp.ProcStart) -> tuple[str, list[str]]:
    if request.cmd == "/bin/bash" and len(request.args) >= 3 and request.args[-2] == "-c":
        words = request.args[-1].split()
        return (words[0] if words else "sleep"), words[1:]
    return request.cmd, list(request.args)


# -- files ---------------------------------------------------------------------------------------------------
@dataclass
class Node:
    kind: str  # file | dir
    data: bytes = b""
    mtime: float = field(default_factory=time.time)


class FakeEnvdAgent:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.procs: dict[int, FakeProc] = {}
        self.starts: list[mp.ProcStart] = []
        self.inputs: list[mp.ProcInput] = []
        self.signals: list[mp.ProcSignal] = []
        self.resizes: list[mp.ProcResize] = []
        self.fs_requests: list[mp.FsRequest] = []
        self.writes: list[tuple[str, bytes]] = []
        self.write_users: list[str | None] = []
        self.closed_streams = 0
        self.nodes: dict[str, Node] = {"/": Node("dir"), "/home": Node("dir"), "/home/user": Node("dir")}
        self.nodes["/root"] = Node("dir")
        self.watches: list[tuple[str, asyncio.Queue[mp.FsEvent]]] = []
        self.watchers: dict[str, tuple[str, list[mp.FsEvent]]] = {}
        self._pids = itertools.count(100)
        self._watcher_ids = itertools.count(1)
        self.start_delay = 0.0  # a start that takes this long (a sandbox waking first)

    # -- processes
    async def proc_start(self, sandbox_id: str, request: mp.ProcStart) -> AsyncIterator[mp.ProcEvent]:
        self.calls.append("proc_start")
        self.starts.append(request)
        if self.start_delay:
            await asyncio.sleep(self.start_delay)
        pid = next(self._pids)
        behaviour, args = _behaviour(request)
        info = mp.ProcInfo(
            pid=pid, tag=request.tag, cmd=request.cmd, args=request.args, env=request.env, cwd=request.cwd
        )
        proc = FakeProc(info=info.model_copy(update={"pty": request.pty is not None}), behaviour=behaviour)
        self.procs[pid] = proc
        if behaviour == "echo":
            proc.out("stdout", (" ".join(args) + "\n").encode())
            proc.exit(0)
        elif behaviour == "fail":
            proc.out("stderr", b"bad\n")
            proc.exit(3)
        elif behaviour == "exit":
            proc.exit(int(args[0]) if args else 0)
        async for event in self._follow(proc):
            yield event

    async def proc_connect(self, sandbox_id: str, process: mp.ProcSelector) -> AsyncIterator[mp.ProcEvent]:
        self.calls.append("proc_connect")
        proc = self._proc(process)
        async for event in self._follow(proc):
            yield event

    async def _follow(self, proc: FakeProc) -> AsyncIterator[mp.ProcEvent]:
        try:
            yield mp.ProcEvent(kind="start", pid=proc.info.pid)
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
            self.closed_streams += 1

    def _proc(self, process: mp.ProcSelector) -> FakeProc:
        for proc in self.procs.values():
            if proc.info.pid == process.pid or (process.tag is not None and proc.info.tag == process.tag):
                return proc
        raise NotFound(f"process {process.pid or process.tag} not found")

    def _live(self, process: mp.ProcSelector) -> FakeProc:
        proc = self._proc(process)
        if proc.ended is not None:
            raise NotFound(f"process {proc.info.pid} has ended")
        return proc

    async def proc_list(self, sandbox_id: str) -> list[mp.ProcInfo]:
        self.calls.append("proc_list")
        return [p.info for p in self.procs.values()]

    async def proc_input(self, sandbox_id: str, request: mp.ProcInput) -> None:
        self.calls.append("proc_input")
        proc = self._live(request.process)
        self.inputs.append(request)
        data = base64.b64decode(request.data_b64)
        proc.inputs.append(data)
        await asyncio.sleep(0)  # let anything out of order overtake (it must not)
        if proc.behaviour == "cat" and data:
            proc.out("stdout", data)
        if request.eof:
            proc.exit(0)

    async def proc_signal(self, sandbox_id: str, request: mp.ProcSignal) -> None:
        self.calls.append("proc_signal")
        proc = self._live(request.process)
        self.signals.append(request)
        name = "killed" if request.signal == 9 else "terminated"
        proc.emit(mp.ProcEvent(kind="end", pid=proc.info.pid, exit_code=-1, status=f"signal: {name}"))

    async def proc_resize(self, sandbox_id: str, request: mp.ProcResize) -> None:
        self.calls.append("proc_resize")
        self._live(request.process)
        self.resizes.append(request)

    # -- files
    def _entry(self, path: str) -> dict[str, object]:
        node = self.nodes.get(path)
        if node is None:
            raise NotFound(f"{path} does not exist")
        return {
            "name": posixpath.basename(path) or "/",
            "path": path,
            "type": node.kind,
            "size": len(node.data),
            "mode": 0o755 if node.kind == "dir" else 0o644,
            "owner": "user",
            "group": "user",
            "mtime": node.mtime,
        }

    def _notify(self, path: str, kind: str) -> None:
        parent = posixpath.dirname(path)
        event = mp.FsEvent.model_validate({"kind": kind, "name": posixpath.basename(path)})
        for watched, queue in self.watches:
            if watched == parent:
                queue.put_nowait(event)
        for watched, events in self.watchers.values():
            if watched == parent:
                events.append(event)

    def _mkdirs(self, path: str) -> bool:
        if path in self.nodes:
            if self.nodes[path].kind != "dir":
                raise InvalidArgument(f"{path} exists and is not a directory")
            return False
        self._mkdirs(posixpath.dirname(path))
        self.nodes[path] = Node("dir")
        self._notify(path, "create")
        return True

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        self.calls.append("read_file")
        node = self.nodes.get(path)
        if node is None:
            raise NotFound(f"{path} does not exist")
        if node.kind == "dir":
            raise InvalidArgument(f"{path} is a directory")
        return node.data

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> WriteResult:
        self.calls.append("write_file")
        self.writes.append((path, data))
        self.write_users.append(user)
        self._mkdirs(posixpath.dirname(path))
        existed = path in self.nodes
        self.nodes[path] = Node("file", data)
        self._notify(path, "write" if existed else "create")
        return WriteResult(path=path, bytes=len(data))

    async def fs(self, sandbox_id: str, request: mp.FsRequest) -> FsReply:
        self.calls.append(f"fs:{request.op}")
        return FsReply.model_validate(self._fs(request))

    def _fs(self, request: mp.FsRequest) -> dict[str, object]:
        self.fs_requests.append(request)
        path = request.path
        if request.op == "stat":
            return self._entry(path)
        if request.op == "list_dir":
            if path not in self.nodes:
                raise NotFound(f"{path} does not exist")
            base = path.rstrip("/") + "/"
            found = [p for p in self.nodes if p.startswith(base) and p != path]
            found = [p for p in found if p[len(base) :].count("/") < request.depth]
            return {"path": path, "entries": [self._entry(p) for p in sorted(found)]}
        if request.op == "mkdir":
            return {"path": path, "created": self._mkdirs(path)}
        if request.op == "delete":
            if path not in self.nodes:
                raise NotFound(f"{path} does not exist")
            for p in [p for p in self.nodes if p == path or p.startswith(path.rstrip("/") + "/")]:
                del self.nodes[p]
            self._notify(path, "remove")
            return {}
        if request.op == "move":
            node = self.nodes.pop(path, None)
            if node is None or request.destination is None:
                raise NotFound(f"{path} does not exist")
            self.nodes[request.destination] = node
            return {"path": request.destination}
        if request.op == "watch_create":
            if path not in self.nodes:
                raise NotFound(f"{path} does not exist")
            watcher = f"g{next(self._watcher_ids)}"
            self.watchers[watcher] = (path, [])
            return {"watcher": watcher}
        if request.op == "watch_events":
            if request.watcher not in self.watchers:
                raise NotFound(f"no watcher {request.watcher}")
            watched, events = self.watchers[request.watcher]
            taken = [e.model_dump() for e in events]
            events.clear()
            return {"events": taken}
        if request.op == "watch_remove":
            if self.watchers.pop(request.watcher or "", None) is None:
                raise NotFound(f"no watcher {request.watcher}")
            return {}
        raise StateError(f"op {request.op} unsupported")

    async def fs_watch(self, sandbox_id: str, request: mp.WatchRequest) -> AsyncIterator[mp.FsEvent]:
        self.calls.append("fs_watch")
        if request.path not in self.nodes:
            raise NotFound(f"{request.path} does not exist")
        queue: asyncio.Queue[mp.FsEvent] = asyncio.Queue()
        watch = (request.path, queue)
        self.watches.append(watch)
        try:
            yield mp.FsEvent(kind="start")
            while True:
                yield await queue.get()
        finally:
            self.watches.remove(watch)
            self.closed_streams += 1


async def no_forward(
    scope: Scope, receive: Receive, send: Send, agent: Agent, sandbox_id: str, port: int, *, host: str | None = None
) -> None:
    raise AssertionError("nothing is forwarded here")


# -- the server ----------------------------------------------------------------------------------------------
def mounted(app: ASGIApp, prefix: str = "/e2b/sandbox") -> Starlette:
    """``app`` mounted like the control plane mounts it."""
    return Starlette(routes=[Mount(prefix, app=app)])


@contextlib.asynccontextmanager
async def serve(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 and yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def until(predicate: Any, timeout: float = 5.0) -> None:
    """Wait for ``predicate()`` to become true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
