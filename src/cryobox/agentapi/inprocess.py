"""The one-process transport: :class:`InProcessAgent` calls an :class:`~.interface.Agent` implementation directly,
deep-copying every model, dict and list that crosses (both ways), so the control plane and the agent never
share a mutable Python object, exactly as if the values had crossed HTTP. Errors cross as copies too (their
``details`` are not shared), raised ``from`` the agent's original for the traceback.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel

from ..errors import CryoboxError
from . import models as m
from .interface import Agent

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def _copy_error(exc: CryoboxError) -> CryoboxError:
    """A copy of ``exc`` with its own ``details`` (the original when its class cannot be rebuilt)."""
    try:
        copied = copy.copy(exc)
    except Exception:
        return exc
    copied.details = copy.deepcopy(exc.details)
    return copied


async def _pass(call: Awaitable[T]) -> T:
    try:
        return await call
    except CryoboxError as exc:
        raise _copy_error(exc) from exc


def _c(model: M) -> M:
    return model.model_copy(deep=True)


def _cs(models: list[M]) -> list[M]:
    return [item.model_copy(deep=True) for item in models]


class InProcessAgent:
    """``Agent`` over direct calls to ``impl``; ``close()`` releases nothing of the agent's (it keeps running)."""

    def __init__(self, impl: Agent) -> None:
        self.impl = impl

    def __repr__(self) -> str:
        return f"InProcessAgent({self.impl!r})"

    async def _stream(self, start: Callable[[], AsyncIterator[M]]) -> AsyncIterator[M]:
        # the implementation is called at the first ``anext``, as the HTTP transport sends at the first ``anext``
        stream: AsyncIterator[M] | None = None
        try:
            stream = start()
            async for item in stream:
                yield item.model_copy(deep=True)
        except CryoboxError as exc:
            raise _copy_error(exc) from exc
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    # -- the host ------------------------------------------------------------------------------------------------

    async def info(self) -> m.AgentInfo:
        return _c(await _pass(self.impl.info()))

    async def capacity(self) -> m.Capacity:
        return _c(await _pass(self.impl.capacity()))

    async def templates(self) -> list[m.TemplateInfo]:
        return _cs(await _pass(self.impl.templates()))

    async def metrics_text(self) -> bytes:
        return bytes(await _pass(self.impl.metrics_text()))

    # -- sandboxes -----------------------------------------------------------------------------------------------

    async def list_sandboxes(self) -> list[m.SandboxInfo]:
        return _cs(await _pass(self.impl.list_sandboxes()))

    async def create(self, spec: m.CreateSpec) -> m.SandboxInfo:
        return _c(await _pass(self.impl.create(_c(spec))))

    async def get(self, sandbox_id: str) -> m.SandboxInfo:
        return _c(await _pass(self.impl.get(sandbox_id)))

    async def delete(self, sandbox_id: str) -> None:
        await _pass(self.impl.delete(sandbox_id))

    async def pause(self, sandbox_id: str) -> m.SandboxInfo:
        return _c(await _pass(self.impl.pause(sandbox_id)))

    async def resume(self, sandbox_id: str) -> m.SandboxInfo:
        return _c(await _pass(self.impl.resume(sandbox_id)))

    async def hibernate(self, sandbox_id: str) -> m.SandboxInfo:
        return _c(await _pass(self.impl.hibernate(sandbox_id)))

    async def wake(self, sandbox_id: str) -> m.SandboxInfo:
        return _c(await _pass(self.impl.wake(sandbox_id)))

    async def store_hibernation(self, sandbox_id: str) -> m.StoredHibernation:
        return _c(await _pass(self.impl.store_hibernation(sandbox_id)))

    async def wake_stored(self, spec: m.WakeSpec) -> m.SandboxInfo:
        return _c(await _pass(self.impl.wake_stored(_c(spec))))

    async def set_lifecycle(self, sandbox_id: str, patch: m.LifecyclePatch) -> m.SandboxInfo:
        return _c(await _pass(self.impl.set_lifecycle(sandbox_id, _c(patch))))

    async def touch(self, sandbox_id: str) -> m.SandboxInfo:
        return _c(await _pass(self.impl.touch(sandbox_id)))

    # -- commands, files, terminals ------------------------------------------------------------------------------

    async def exec(self, sandbox_id: str, request: m.ExecRequest) -> m.ExecResult:
        return _c(await _pass(self.impl.exec(sandbox_id, _c(request))))

    def exec_stream(self, sandbox_id: str, request: m.ExecRequest) -> AsyncIterator[m.ExecEvent]:
        request = _c(request)
        return self._stream(lambda: self.impl.exec_stream(sandbox_id, request))

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        return bytes(await _pass(self.impl.read_file(sandbox_id, path)))

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> m.WriteResult:
        return _c(await _pass(self.impl.write_file(sandbox_id, path, bytes(data), user=user)))

    async def file_op(self, sandbox_id: str, op: str, path: str) -> m.FsReply:
        return _c(await _pass(self.impl.file_op(sandbox_id, op, path)))

    async def inspect_net(self, sandbox_id: str) -> m.NetInspection:
        return _c(await _pass(self.impl.inspect_net(sandbox_id)))

    def pty_open(self, sandbox_id: str, request: m.PtyOpen) -> AsyncIterator[m.PtyEvent]:
        request = _c(request)
        return self._stream(lambda: self.impl.pty_open(sandbox_id, request))

    async def pty_input(self, sandbox_id: str, session: str, data: bytes) -> None:
        await _pass(self.impl.pty_input(sandbox_id, session, bytes(data)))

    async def pty_resize(self, sandbox_id: str, session: str, cols: int, rows: int) -> None:
        await _pass(self.impl.pty_resize(sandbox_id, session, cols, rows))

    async def pty_close(self, sandbox_id: str, session: str) -> None:
        await _pass(self.impl.pty_close(sandbox_id, session))

    # -- long-lived processes, watches, file ops, ports ------------------------------------------------------------

    def proc_start(self, sandbox_id: str, request: m.ProcStart) -> AsyncIterator[m.ProcEvent]:
        request = _c(request)
        return self._stream(lambda: self.impl.proc_start(sandbox_id, request))

    def proc_connect(self, sandbox_id: str, process: m.ProcSelector) -> AsyncIterator[m.ProcEvent]:
        process = _c(process)
        return self._stream(lambda: self.impl.proc_connect(sandbox_id, process))

    async def proc_list(self, sandbox_id: str) -> list[m.ProcInfo]:
        return _cs(await _pass(self.impl.proc_list(sandbox_id)))

    async def proc_input(self, sandbox_id: str, request: m.ProcInput) -> None:
        await _pass(self.impl.proc_input(sandbox_id, _c(request)))

    async def proc_signal(self, sandbox_id: str, request: m.ProcSignal) -> None:
        await _pass(self.impl.proc_signal(sandbox_id, _c(request)))

    async def proc_resize(self, sandbox_id: str, request: m.ProcResize) -> None:
        await _pass(self.impl.proc_resize(sandbox_id, _c(request)))

    async def fs(self, sandbox_id: str, request: m.FsRequest) -> m.FsReply:
        return _c(await _pass(self.impl.fs(sandbox_id, _c(request))))

    def fs_watch(self, sandbox_id: str, request: m.WatchRequest) -> AsyncIterator[m.FsEvent]:
        request = _c(request)
        return self._stream(lambda: self.impl.fs_watch(sandbox_id, request))

    async def port_target(self, sandbox_id: str, port: int) -> m.PortTarget:
        return _c(await _pass(self.impl.port_target(sandbox_id, port)))

    # -- snapshots and forks -------------------------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, request: m.SnapshotRequest) -> m.SnapshotInfo:
        return _c(await _pass(self.impl.snapshot(sandbox_id, _c(request))))

    async def store_snapshot(self, snapshot_id: str) -> m.StoredSnapshot:
        return _c(await _pass(self.impl.store_snapshot(snapshot_id)))

    async def delete_snapshot(self, snapshot_id: str, *, from_store: bool = False) -> None:
        await _pass(self.impl.delete_snapshot(snapshot_id, from_store=from_store))

    async def prune_snapshots(self, keep: list[str]) -> list[str]:
        return list(await _pass(self.impl.prune_snapshots(list(keep))))

    async def fork(self, sandbox_id: str, request: m.ForkRequest) -> m.SandboxInfo:
        return _c(await _pass(self.impl.fork(sandbox_id, _c(request))))

    async def fork_tree(self, sandbox_id: str, request: m.TreeRequest) -> m.TreeResult:
        return _c(await _pass(self.impl.fork_tree(sandbox_id, _c(request))))

    async def evidence_list(self, snapshot_id: str) -> list[m.EvidenceEntry]:
        return _cs(await _pass(self.impl.evidence_list(snapshot_id)))

    async def evidence_read(self, snapshot_id: str, name: str) -> bytes:
        return bytes(await _pass(self.impl.evidence_read(snapshot_id, name)))

    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int:
        return int(await _pass(self.impl.evidence_put(snapshot_id, name, bytes(data))))

    # -- templates -----------------------------------------------------------------------------------------------

    def build_template(self, build: m.TemplateBuild) -> AsyncIterator[m.BuildEvent]:
        build = _c(build)
        return self._stream(lambda: self.impl.build_template(build))

    async def remove_template(self, name: str) -> None:
        await _pass(self.impl.remove_template(name))

    async def close(self) -> None:
        """Nothing to release: the agent is not this object's to stop."""


__all__ = ["InProcessAgent"]
