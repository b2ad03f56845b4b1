"""A volume's files without a sandbox of the caller's: E2B's volume content API and ``cryobox volume cp``.

The host never mounts or parses a tenant's file system. A content call runs in a **system sandbox**: a ``base``
sandbox of the volume's workspace with the volume mounted at :data:`MOUNT` and no network, made on the first call
and reused until it has been idle for ``idle_s`` (default 15 s), then deleted. Its metadata says what it is
(``cryobox.system: volume-content``, ``cryobox.volume: <name>``); it counts against the workspace's sandbox quota
while it lives. Each call runs :mod:`.volumeguest` in it (paths checked in the guest) and, for file bodies, the
agent's file read and write.

Who may hold the volume meanwhile (the one-writer-or-readers rule of :mod:`.volumes` still holds):

- nobody: the system sandbox mounts it read-write;
- sandboxes reading it: the system sandbox mounts it read-only beside them; writes are 409;
- a sandbox writing it: 409 for every content call (the guest that has it mounted owns its state: use that
  sandbox's files API);
- the system sandbox itself, when a create asks for the volume: it is deleted first (:meth:`evict`), so a content
  call never keeps a user's create from mounting the volume.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...agentapi import MAX_FILE_BYTES, Agent
from ...agentapi.models import ExecRequest
from ...errors import CryoboxError, GuestError, InvalidArgument, NotFound, PayloadTooLarge, StateError
from ...registry.volumes import VolumeRow
from .volumeguest import SCRIPT
from .volumes import MountRequest

log = logging.getLogger(__name__)
MOUNT = "/mnt/volume"
SYSTEM_KEY = "cryobox.system"
SYSTEM_VALUE = "volume-content"
DEFAULT_IDLE_S = 15.0
SWEEP_EVERY_S = 2.0
"""How often the app looks for idle system sandboxes (:meth:`VolumeContent.sweep`)."""
OP_TIMEOUT_S = 60.0
ERRORS: dict[str, Callable[[str], CryoboxError]] = {
    "not_found": lambda m: NotFound(m),
    "exists": lambda m: StateError(m, state="exists", required="absent"),
    "is_dir": lambda m: StateError(m, state="directory", required="file"),
    "not_dir": lambda m: InvalidArgument(m),
    "invalid": lambda m: InvalidArgument(m),
}


class SandboxMaker(Protocol):
    """What the content API needs of the control plane: a system sandbox with the volume, and its deletion."""

    async def make(self, row: VolumeRow, mount: MountRequest) -> tuple[str, Agent]: ...

    async def remove(self, sandbox_id: str, workspace_id: str) -> None: ...


@dataclass
class _Held:
    sandbox_id: str
    workspace_id: str
    agent: Agent
    read_only: bool
    last_used: float
    busy: int = 0


class VolumeContent:
    """System sandboxes by volume id, and the content operations run in them."""

    def __init__(self, maker: SandboxMaker, clock: Callable[[], float], idle_s: float = DEFAULT_IDLE_S) -> None:
        self.maker = maker
        self.clock = clock
        self.idle_s = idle_s
        self._held: dict[str, _Held] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def system_sandboxes(self) -> set[str]:
        return {held.sandbox_id for held in self._held.values()}

    # -- the system sandbox ------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _sandbox(self, row: VolumeRow, *, write: bool) -> Any:
        lock = self._locks.setdefault(row.id, asyncio.Lock())
        async with lock:
            held = self._held.get(row.id)
            others = [a for a in row.attachments if held is None or a.sandbox_id != held.sandbox_id]
            writer = next((a for a in others if not a.read_only), None)
            if writer is not None:
                raise StateError(
                    f"volume {row.name!r} is mounted read-write by sandbox {writer.sandbox_id}: use its files, "
                    "or delete it first",
                    state="attached",
                    required="detached",
                    details={"attached_to": [writer.sandbox_id]},
                )
            if write and others:
                raise StateError(
                    f"volume {row.name!r} is mounted read-only by sandboxes: it cannot be written until they go",
                    state="attached",
                    required="detached",
                    details={"attached_to": [a.sandbox_id for a in others]},
                )
            if held is not None and write and held.read_only:
                await self._drop(row.id)
                held = None
            if held is None:
                read_only = bool(others)
                sandbox_id, agent = await self.maker.make(row, MountRequest(row.name, MOUNT, read_only=read_only))
                held = self._held[row.id] = _Held(sandbox_id, row.workspace_id, agent, read_only, self.clock())
            held.busy += 1
        try:
            yield held
        finally:
            held.busy -= 1
            held.last_used = self.clock()

    async def _drop(self, volume_id: str) -> None:
        held = self._held.pop(volume_id, None)
        if held is not None:
            with contextlib.suppress(NotFound):
                await self.maker.remove(held.sandbox_id, held.workspace_id)

    async def evict(self, volume_id: str) -> bool:
        """Delete the volume's system sandbox (waiting for a call in it to finish); whether there was one."""
        lock = self._locks.setdefault(volume_id, asyncio.Lock())
        async with lock:
            had = volume_id in self._held
            await self._drop(volume_id)
            return had

    async def sweep(self) -> list[str]:
        """Delete the system sandboxes idle for ``idle_s``; returns the volume ids let go."""
        now = self.clock()
        idle = [v for v, h in self._held.items() if h.busy == 0 and now - h.last_used >= self.idle_s]
        for volume_id in idle:
            lock = self._locks.setdefault(volume_id, asyncio.Lock())
            async with lock:
                held = self._held.get(volume_id)
                if held is not None and held.busy == 0 and now - held.last_used >= self.idle_s:
                    await self._drop(volume_id)
        return idle

    async def close(self) -> None:
        """Delete every system sandbox (a stopping control plane leaves none holding a volume)."""
        for volume_id in list(self._held):
            with contextlib.suppress(CryoboxError):
                await self._drop(volume_id)

    # -- operations ------------------------------------------------------------------------------------------

    async def _run(self, held: _Held, op: str, args: dict[str, Any]) -> Any:
        cmd = f"python3 - {shlex.quote(op)} {MOUNT} {shlex.quote(json.dumps(args))}"
        request = ExecRequest(
            cmd=cmd, timeout_s=OP_TIMEOUT_S, stdin_b64=base64.b64encode(SCRIPT.encode()).decode(), user="root"
        )
        result = await held.agent.exec(held.sandbox_id, request)
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            raise GuestError(f"volume {op} failed in its system sandbox: {result.stderr.strip()[-300:]}") from None
        if isinstance(answer, dict) and "error" in answer:
            make = ERRORS.get(str(answer["error"]), ERRORS["invalid"])
            raise make(f"{args.get('path', '')}: {answer.get('message', answer['error'])}")
        return answer

    async def stat(self, row: VolumeRow, path: str) -> dict[str, Any]:
        async with self._sandbox(row, write=False) as held:
            return dict(await self._run(held, "stat", {"path": check_path(path)}))

    async def list(self, row: VolumeRow, path: str, depth: int = 1) -> list[dict[str, Any]]:
        if not 1 <= depth <= 64:
            raise InvalidArgument("depth must be 1 to 64", details={"depth": depth})
        async with self._sandbox(row, write=False) as held:
            return list(await self._run(held, "list", {"path": check_path(path), "depth": depth}))

    async def mkdir(self, row: VolumeRow, path: str, meta: Meta, *, force: bool) -> dict[str, Any]:
        async with self._sandbox(row, write=True) as held:
            return dict(await self._run(held, "mkdir", {"path": check_path(path), "force": force, **meta.args()}))

    async def chmeta(self, row: VolumeRow, path: str, meta: Meta) -> dict[str, Any]:
        async with self._sandbox(row, write=True) as held:
            return dict(await self._run(held, "chmeta", {"path": check_path(path), **meta.args()}))

    async def remove(self, row: VolumeRow, path: str) -> None:
        async with self._sandbox(row, write=True) as held:
            await self._run(held, "remove", {"path": check_path(path)})

    async def read(self, row: VolumeRow, path: str) -> bytes:
        async with self._sandbox(row, write=False) as held:
            found = await self._run(held, "readable", {"path": check_path(path)})
            if int(found["size"]) > MAX_FILE_BYTES:
                raise PayloadTooLarge(f"{path} is larger than {MAX_FILE_BYTES} bytes", details={"path": path})
            data: bytes = await held.agent.read_file(held.sandbox_id, str(found["path"]))
            return data

    async def write(self, row: VolumeRow, path: str, data: bytes, meta: Meta, *, force: bool | None) -> dict[str, Any]:
        async with self._sandbox(row, write=True) as held:
            args: dict[str, Any] = {"path": check_path(path)}
            if force is not None:
                args["force"] = force
            target = await self._run(held, "prewrite", args)
            await held.agent.write_file(held.sandbox_id, str(target["path"]), data, user="root")
            return dict(await self._run(held, "postwrite", {"path": args["path"], **meta.args()}))


@dataclass(frozen=True)
class Meta:
    """Owner and mode asked for an entry (``None``: unchanged, or for a new one the defaults)."""

    uid: int | None = None
    gid: int | None = None
    mode: int | None = None

    def __post_init__(self) -> None:
        for name, value, top in (("uid", self.uid, 1 << 31), ("gid", self.gid, 1 << 31), ("mode", self.mode, 0o7777)):
            if value is not None and not 0 <= value <= top:
                raise InvalidArgument(f"{name} {value} is out of range", details={"field": name})

    def args(self) -> dict[str, int]:
        return {k: v for k, v in (("uid", self.uid), ("gid", self.gid), ("mode", self.mode)) if v is not None}


def check_path(path: str) -> str:
    """An absolute path in the volume (``/`` its root); 400 for an empty one or one with a NUL."""
    if not path or "\0" in path or len(path) > 4096:
        raise InvalidArgument("path must be 1-4096 characters without NUL", details={"field": "path"})
    return path if path.startswith("/") else f"/{path}"


Sweeper = Callable[[], Awaitable[None]]
