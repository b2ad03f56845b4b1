"""Long-lived guest processes, directory watches, richer file ops and port targets on the host agent.

The interface's methods of those (:class:`~cryobox.agentapi.Agent`), mixed into :class:`~.hostagent.HostAgent`.
Each translates the wire models of :mod:`cryobox.agentapi.models_procs` to the guest agent's ``proc_*``,
``watch_*`` and file ops (``guest/ops_procs.py``, ``guest/ops_watch.py``, ``guest/ops_files.py``) and back.
The sandbox's own ``env`` (set at create) is under every process's env, like for exec. A stream's consumer
closing it early cancels the guest request (:meth:`GuestClient.stream`), which only detaches: the process
keeps running.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from typing import Any

from ...agentapi import models as am
from ...errors import InvalidArgument, StateError
from ...util.encoding import unb64
from ..guest.client import LISTING_REPLY, GuestClient
from ..sandbox.sandbox import Sandbox
from ..sandbox.service import SandboxService

CALL_TIMEOUT_S = 30.0
FS_KINDS = frozenset({"create", "write", "remove", "rename", "chmod"})


KILL_SETTLE_S = 2.0
"""How long a ``SIGKILL`` waits for the guest to list the process ended."""
KILL_POLL_S = 0.005


def _selects(process: am.ProcSelector, info: am.ProcInfo) -> bool:
    return info.pid == process.pid if process.pid is not None else info.tag == process.tag


def selector_args(process: am.ProcSelector) -> dict[str, Any]:
    return {"pid": process.pid} if process.pid is not None else {"tag": process.tag}


def start_args(sandbox: Sandbox, request: am.ProcStart) -> dict[str, Any]:
    return {
        "cmd": request.cmd,
        "args": list(request.args),
        "env": {**sandbox.env, **request.env},
        "cwd": request.cwd,
        "user": request.user,
        **({"default_user": request.default_user} if request.default_user is not None else {}),
        "tag": request.tag,
        "pty": {"cols": request.pty.cols, "rows": request.pty.rows} if request.pty is not None else None,
        "stdin": request.stdin,
        "attach": True,
    }


async def proc_events(guest: GuestClient, op: str, args: dict[str, Any]) -> AsyncIterator[am.ProcEvent]:
    """The guest's ``start``/output/``dropped`` events and final reply as :class:`~am.ProcEvent` values; a reply
    saying the request detached (cancelled) ends the stream without an ``end`` event."""
    pid: int | None = None
    dropped = 0
    async for event in guest.stream(op, args):
        kind = event.get("event")
        data = event.get("data")
        if kind == "start":
            pid = int(_text(data) or 0) or None
            yield am.ProcEvent(kind="start", pid=pid)
        elif kind == "dropped":
            dropped = int(_text(data) or 0)
        elif kind in ("stdout", "stderr", "pty"):
            yield am.ProcEvent(kind=kind, pid=pid, data_b64=str(data or ""), dropped=dropped)
            dropped = 0
        elif kind == "result":
            result = event.get("result") or {}
            if result.get("detached"):
                return
            yield am.ProcEvent(
                kind="end",
                pid=result.get("pid", pid),
                exit_code=result.get("exit_code"),
                status=str(result.get("status") or ""),
                error=result.get("error"),
            )
            return


def _text(data: object) -> str:
    return unb64(data if isinstance(data, str) else None).decode(errors="replace")


class ProcEndpoints:
    """The interface's process, watch, file-system and port methods (mixed into ``HostAgent``)."""

    service: SandboxService

    async def _call(self, sandbox_id: str, op: str, args: dict[str, Any], max_reply: int = 1 << 20) -> dict[str, Any]:
        async with self.service.busy(sandbox_id):
            _, guest = await self.service.guest(sandbox_id)
            return await guest.call(op, args, timeout=CALL_TIMEOUT_S, max_reply=max_reply)

    async def proc_start(self, sandbox_id: str, request: am.ProcStart) -> AsyncIterator[am.ProcEvent]:
        async with self.service.busy(sandbox_id):
            sandbox, guest = await self.service.guest(sandbox_id)
            async for event in proc_events(guest, "proc_start", start_args(sandbox, request)):
                yield event

    async def proc_connect(self, sandbox_id: str, process: am.ProcSelector) -> AsyncIterator[am.ProcEvent]:
        async with self.service.busy(sandbox_id):
            _, guest = await self.service.guest(sandbox_id)
            async for event in proc_events(guest, "proc_connect", selector_args(process)):
                yield event

    async def proc_list(self, sandbox_id: str) -> list[am.ProcInfo]:
        reply = await self._call(sandbox_id, "proc_list", {}, max_reply=LISTING_REPLY)
        return [am.ProcInfo.model_validate(p) for p in reply.get("processes") or [] if isinstance(p, dict)]

    async def proc_input(self, sandbox_id: str, request: am.ProcInput) -> None:
        args = {**selector_args(request.process), "data": request.data_b64, "eof": request.eof}
        await self._call(sandbox_id, "proc_input", args)

    async def proc_signal(self, sandbox_id: str, request: am.ProcSignal) -> None:
        """Signal the process; a ``SIGKILL`` answers once the guest lists it ended (its reaper runs a moment after
        the signal: a list right after a kill never shows it running), at most :data:`KILL_SETTLE_S` later."""
        await self._call(sandbox_id, "proc_signal", {**selector_args(request.process), "signal": request.signal})
        if request.signal == signal.SIGKILL:
            await self._until_ended(sandbox_id, request.process)

    async def _until_ended(self, sandbox_id: str, process: am.ProcSelector) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KILL_SETTLE_S
        while any(p.running and _selects(process, p) for p in await self.proc_list(sandbox_id)):
            if loop.time() >= deadline:
                return
            await asyncio.sleep(KILL_POLL_S)

    async def proc_resize(self, sandbox_id: str, request: am.ProcResize) -> None:
        size = {"cols": request.size.cols, "rows": request.size.rows}
        await self._call(sandbox_id, "proc_resize", {**selector_args(request.process), **size})

    async def fs(self, sandbox_id: str, request: am.FsRequest) -> am.FsReply:
        if request.op.startswith("watch_") and request.op != "watch_create":
            if not request.watcher:
                raise InvalidArgument(f"{request.op} needs 'watcher'")
            args: dict[str, Any] = {"watcher": request.watcher}
        else:
            if not request.path.startswith("/") or "\x00" in request.path:
                raise InvalidArgument("path must be absolute", details={"path": request.path})
            args = {"path": request.path}
            if request.op == "list_dir":
                args["depth"] = request.depth
            elif request.op == "move":
                if not request.destination or not request.destination.startswith("/"):
                    raise InvalidArgument("move needs an absolute 'destination'")
                args["destination"] = request.destination
            elif request.op == "watch_create":
                args["recursive"] = request.recursive
            if request.user is not None and request.op in ("mkdir", "move"):
                args["user"] = request.user
        return am.FsReply.from_guest(await self._call(sandbox_id, request.op, args, max_reply=LISTING_REPLY))

    async def fs_watch(self, sandbox_id: str, request: am.WatchRequest) -> AsyncIterator[am.FsEvent]:
        if not request.path.startswith("/") or "\x00" in request.path:
            raise InvalidArgument("path must be absolute", details={"path": request.path})
        async with self.service.busy(sandbox_id):
            _, guest = await self.service.guest(sandbox_id)
            async for event in guest.stream("watch_dir", {"path": request.path, "recursive": request.recursive}):
                kind = event.get("event")
                if kind == "start":
                    yield am.FsEvent(kind="start")
                elif kind == "fs":
                    try:
                        change = json.loads(_text(event.get("data")))
                    except ValueError:
                        continue
                    if isinstance(change, dict) and change.get("kind") in FS_KINDS:
                        yield am.FsEvent(kind=change["kind"], name=str(change.get("name") or ""))
                elif kind == "result":
                    return

    async def port_target(self, sandbox_id: str, port: int) -> am.PortTarget:
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be 1-65535, got {port}", details={"port": port})
        sandbox, _ = await self.service.guest(sandbox_id)  # wakes a hibernated sandbox, refuses a paused one
        if sandbox.guest_ip is None:
            raise StateError(f"sandbox {sandbox_id} has no network", state="no_network", required="network")
        return am.PortTarget(url=f"http://{sandbox.guest_ip}:{port}")
