"""envd's ``filesystem.Filesystem`` service, served by the control plane on the agent's ``fs`` / ``fs_watch``.

Paths resolve against the user's home like envd's (:meth:`~.session.Target.resolve`); ``MakeDir`` and ``Move``
create as that user. ``MakeDir`` of an existing directory is ``already_exists`` (the SDK's ``make_dir`` answers
``False``), ``ListDir`` descends ``depth`` levels (0 means 1; deeper than :data:`MAX_DEPTH` is cut there) and
``Remove`` is recursive, as in envd.

Watches: ``WatchDir`` streams (``start`` once the watch is in place, then one event per change, keepalives in
between); the ``CreateWatcher`` trio (what the sync SDK's ``watch_dir`` uses) keeps the events in the guest. Its
watcher id is opaque to the SDK and carries what ``GetWatcherEvents`` needs besides the guest's id (the watched
path and ``include_entry``), so any control-plane replica can answer it. With ``include_entry`` each change
names the entry as ``Stat`` would, when it can still be stat-ed.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from pydantic import ValidationError

from ....agentapi import models_procs as mp
from ....agentapi.models_guest import FsReply
from ....errors import GuestError, InvalidArgument, NotFound
from .entries import answer_entries, answer_entry, entry_info, watch_event
from .gen.filesystem import filesystem_pb as pb
from .gen.filesystem.filesystem_connect import Filesystem
from .session import DEFAULT_USER, SandboxOpener, Target, open_target
from .streams import keepalive_interval, with_keepalive

MAX_DEPTH = 64
WATCHER_PREFIX = "w1."


def _keepalive() -> pb.WatchDirResponse:
    event: Oneof[Literal["keepalive"], pb.WatchDirResponse.KeepAlive] = Oneof(
        "keepalive", pb.WatchDirResponse.KeepAlive()
    )
    return pb.WatchDirResponse(event=event)


def _started() -> pb.WatchDirResponse:
    event: Oneof[Literal["start"], pb.WatchDirResponse.StartEvent] = Oneof("start", pb.WatchDirResponse.StartEvent())
    return pb.WatchDirResponse(event=event)


@dataclass(frozen=True)
class WatcherRef:
    """What a ``CreateWatcher`` id stands for."""

    guest_id: str
    path: str
    include_entry: bool

    def encode(self) -> str:
        payload = json.dumps({"id": self.guest_id, "path": self.path, "entry": self.include_entry})
        return WATCHER_PREFIX + base64.urlsafe_b64encode(payload.encode()).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, watcher_id: str) -> WatcherRef:
        unknown = NotFound(f"watcher {watcher_id[:80]!r} not found")
        if not watcher_id.startswith(WATCHER_PREFIX):
            raise unknown
        body = watcher_id[len(WATCHER_PREFIX) :]
        try:
            raw = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (binascii.Error, ValueError) as err:
            raise unknown from err
        if not isinstance(raw, dict):
            raise unknown
        guest_id, path, entry = raw.get("id"), raw.get("path"), raw.get("entry")
        if not isinstance(guest_id, str) or not isinstance(path, str) or not isinstance(entry, bool):
            raise unknown
        return cls(guest_id=guest_id, path=path, include_entry=entry)


def _guest_watcher_id(answer: FsReply) -> str:
    extra = answer.model_extra or {}
    for value in (answer.watcher, extra.get("watcher_id"), extra.get("id")):
        if isinstance(value, str) and value:
            return value
    raise GuestError("the guest did not name the watcher it created")


class FilesystemService(Filesystem):
    def __init__(self, opener: SandboxOpener, *, default_user: str = DEFAULT_USER) -> None:
        self._opener = opener
        self._default_user = default_user

    async def _target(self, ctx: RequestContext[Any, Any]) -> Target:
        return await open_target(self._opener, ctx.request_headers, default_user=self._default_user)

    async def _fs(self, target: Target, **fields: object) -> FsReply:
        request = mp.FsRequest.model_validate({"user": target.user, **fields})
        return await target.agent.fs(target.sandbox_id, request)

    async def _stat(self, target: Target, path: str) -> pb.EntryInfo:
        return entry_info(answer_entry(await self._fs(target, op="stat", path=path)))

    async def _entry_or_stat(self, target: Target, answer: FsReply, path: str) -> pb.EntryInfo:
        entry = answer_entry(answer)
        if entry.model_fields_set & {"type", "is_dir"}:
            return entry_info(entry)
        return await self._stat(target, path)

    # -- single calls --------------------------------------------------------------------------------------
    async def stat(
        self, request: pb.StatRequest, ctx: RequestContext[pb.StatRequest, pb.StatResponse], /
    ) -> pb.StatResponse:
        target = await self._target(ctx)
        return pb.StatResponse(entry=await self._stat(target, target.resolve(request.path)))

    async def make_dir(
        self, request: pb.MakeDirRequest, ctx: RequestContext[pb.MakeDirRequest, pb.MakeDirResponse], /
    ) -> pb.MakeDirResponse:
        target = await self._target(ctx)
        path = target.resolve(request.path)
        answer = await self._fs(target, op="mkdir", path=path)
        if answer.created is False:
            raise ConnectError(Code.ALREADY_EXISTS, f"directory already exists: {path}")
        entry = answer_entry(answer)
        if "type" in entry.model_fields_set:
            return pb.MakeDirResponse(entry=entry_info(entry))
        name = posixpath.basename(path.rstrip("/")) or "/"
        return pb.MakeDirResponse(entry=pb.EntryInfo(name=name, type=pb.FileType.DIRECTORY, path=path))

    async def move(
        self, request: pb.MoveRequest, ctx: RequestContext[pb.MoveRequest, pb.MoveResponse], /
    ) -> pb.MoveResponse:
        target = await self._target(ctx)
        source, destination = target.resolve(request.source), target.resolve(request.destination)
        answer = await self._fs(target, op="move", path=source, destination=destination)
        return pb.MoveResponse(entry=await self._entry_or_stat(target, answer, destination))

    async def list_dir(
        self, request: pb.ListDirRequest, ctx: RequestContext[pb.ListDirRequest, pb.ListDirResponse], /
    ) -> pb.ListDirResponse:
        target = await self._target(ctx)
        depth = min(max(request.depth, 1), MAX_DEPTH)
        answer = await self._fs(target, op="list_dir", path=target.resolve(request.path), depth=depth)
        return pb.ListDirResponse(entries=answer_entries(answer))

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[pb.RemoveRequest, pb.RemoveResponse], /
    ) -> pb.RemoveResponse:
        target = await self._target(ctx)
        await self._fs(target, op="delete", path=target.resolve(request.path), recursive=True)
        return pb.RemoveResponse()

    # -- watches -------------------------------------------------------------------------------------------
    async def _event(
        self, target: Target, watched: str, event: mp.FsEvent, include_entry: bool
    ) -> pb.FilesystemEvent | None:
        entry: pb.EntryInfo | None = None
        if include_entry and event.kind != "remove" and event.name:
            try:
                entry = await self._stat(target, posixpath.join(watched, event.name))
            except (NotFound, InvalidArgument):
                entry = None  # gone again (or renamed away): envd sends no entry then either
        return watch_event(event, entry)

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[pb.WatchDirRequest, pb.WatchDirResponse], /
    ) -> AsyncIterator[pb.WatchDirResponse]:
        target = await self._target(ctx)
        path = target.resolve(request.path)
        source = target.agent.fs_watch(target.sandbox_id, mp.WatchRequest(path=path, recursive=request.recursive))
        async with aclosing(with_keepalive(source, keepalive_interval(ctx.request_headers))) as events:
            async for event in events:
                if event is None:
                    yield _keepalive()
                elif event.kind == "start":
                    yield _started()
                elif (change := await self._event(target, path, event, request.include_entry)) is not None:
                    item: Oneof[Literal["filesystem"], pb.FilesystemEvent] = Oneof("filesystem", change)
                    yield pb.WatchDirResponse(event=item)

    async def create_watcher(
        self,
        request: pb.CreateWatcherRequest,
        ctx: RequestContext[pb.CreateWatcherRequest, pb.CreateWatcherResponse],
        /,
    ) -> pb.CreateWatcherResponse:
        target = await self._target(ctx)
        path = target.resolve(request.path)
        answer = await self._fs(target, op="watch_create", path=path, recursive=request.recursive)
        ref = WatcherRef(guest_id=_guest_watcher_id(answer), path=path, include_entry=request.include_entry)
        return pb.CreateWatcherResponse(watcher_id=ref.encode())

    async def get_watcher_events(
        self,
        request: pb.GetWatcherEventsRequest,
        ctx: RequestContext[pb.GetWatcherEventsRequest, pb.GetWatcherEventsResponse],
        /,
    ) -> pb.GetWatcherEventsResponse:
        target = await self._target(ctx)
        ref = WatcherRef.decode(request.watcher_id)
        answer = await self._fs(target, op="watch_events", watcher=ref.guest_id)
        events: list[pb.FilesystemEvent] = []
        for item in answer.events or []:
            try:
                event = mp.FsEvent.model_validate(item.model_dump())
            except ValidationError:
                continue  # a kind of change envd has no name for
            change = await self._event(target, ref.path, event, ref.include_entry)
            if change is not None:
                events.append(change)
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self,
        request: pb.RemoveWatcherRequest,
        ctx: RequestContext[pb.RemoveWatcherRequest, pb.RemoveWatcherResponse],
        /,
    ) -> pb.RemoveWatcherResponse:
        target = await self._target(ctx)
        ref = WatcherRef.decode(request.watcher_id)
        await self._fs(target, op="watch_remove", watcher=ref.guest_id)
        return pb.RemoveWatcherResponse()
