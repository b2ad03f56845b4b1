"""envd's filesystem service over real HTTP, driven by connectrpc's client with the JSON codec, against an
in-memory agent."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from connectrpc.code import Code
from connectrpc.codec import proto_json_codec
from connectrpc.errors import ConnectError

from cryobox.agentapi import models_procs as mp
from cryobox.agentapi.models_guest import FsEntry
from cryobox.compat.e2b.envd import create_envd_app
from cryobox.compat.e2b.envd.entries import entry_info, permissions
from cryobox.compat.e2b.envd.filesystem import WatcherRef
from cryobox.compat.e2b.envd.gen.filesystem import filesystem_pb as pb
from cryobox.compat.e2b.envd.gen.filesystem.filesystem_connect import FilesystemClient
from cryobox.errors import GuestError
from tests.support.envd import HEADERS, FakeAccess, FakeEnvdAgent, Node, mounted, no_forward, serve, until


@dataclass
class Env:
    agent: FakeEnvdAgent
    client: FilesystemClient


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    agent = FakeEnvdAgent()
    agent.nodes["/home/user/a.txt"] = Node("file", b"hello", mtime=1_700_000_000.25)
    agent.nodes["/home/user/sub"] = Node("dir")
    agent.nodes["/home/user/sub/b.txt"] = Node("file", b"b")
    app = create_envd_app(FakeAccess(agent), no_forward)
    async with serve(mounted(app)) as base:
        client = FilesystemClient(
            f"{base}/e2b/sandbox", codec=proto_json_codec(), send_compression=None, accept_compression=()
        )
        yield Env(agent, client)


def as_user(user: str) -> dict[str, str]:
    return {**HEADERS, "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


async def test_stat_resolves_relative_paths_against_the_home(env: Env) -> None:
    entry = (await env.client.stat(pb.StatRequest(path="a.txt"), headers=HEADERS)).entry
    assert entry is not None
    assert (entry.name, entry.path, entry.type, entry.size, entry.mode) == (
        "a.txt",
        "/home/user/a.txt",
        pb.FileType.FILE,
        5,
        0o644,
    )
    assert (entry.permissions, entry.owner, entry.has_field("symlink_target")) == ("-rw-r--r--", "user", False)
    assert entry.modified_time is not None and entry.modified_time.to_seconds() == pytest.approx(1_700_000_000.25)
    await env.client.stat(pb.StatRequest(path="~/sub"), headers=HEADERS)
    assert [r.path for r in env.agent.fs_requests] == ["/home/user/a.txt", "/home/user/sub"]
    with pytest.raises(ConnectError) as err:
        await env.client.stat(pb.StatRequest(path="a.txt"), headers=as_user("root"))
    assert err.value.code is Code.NOT_FOUND
    assert env.agent.fs_requests[-1].path == "/root/a.txt"


async def test_wrong_token_never_reaches_the_agent(env: Env) -> None:
    with pytest.raises(ConnectError) as err:
        await env.client.stat(pb.StatRequest(path="a.txt"), headers={**HEADERS, "X-Access-Token": "x"})
    assert err.value.code is Code.UNAUTHENTICATED
    assert env.agent.calls == []


async def test_list_dir_depth(env: Env) -> None:
    one = await env.client.list_dir(pb.ListDirRequest(path="/home/user"), headers=HEADERS)
    assert [(e.name, e.type) for e in one.entries] == [("a.txt", pb.FileType.FILE), ("sub", pb.FileType.DIRECTORY)]
    assert env.agent.fs_requests[-1].depth == 1
    two = await env.client.list_dir(pb.ListDirRequest(path="", depth=2), headers=HEADERS)
    assert [e.path for e in two.entries] == ["/home/user/a.txt", "/home/user/sub", "/home/user/sub/b.txt"]
    await env.client.list_dir(pb.ListDirRequest(path="/", depth=1000), headers=HEADERS)
    assert env.agent.fs_requests[-1].depth == 64


async def test_make_dir_already_exists_move_and_remove(env: Env) -> None:
    made = await env.client.make_dir(pb.MakeDirRequest(path="new/deep"), headers=HEADERS)
    assert made.entry is not None and (made.entry.path, made.entry.type) == (
        "/home/user/new/deep",
        pb.FileType.DIRECTORY,
    )
    assert env.agent.fs_requests[-1].user == "user"
    with pytest.raises(ConnectError) as err:
        await env.client.make_dir(pb.MakeDirRequest(path="new/deep"), headers=HEADERS)
    assert err.value.code is Code.ALREADY_EXISTS
    moved = await env.client.move(pb.MoveRequest(source="a.txt", destination="new/a.txt"), headers=HEADERS)
    assert moved.entry is not None and (moved.entry.path, moved.entry.size) == ("/home/user/new/a.txt", 5)
    await env.client.remove(pb.RemoveRequest(path="new"), headers=HEADERS)
    assert env.agent.fs_requests[-1].recursive is True
    assert "/home/user/new/a.txt" not in env.agent.nodes
    with pytest.raises(ConnectError) as err:
        await env.client.remove(pb.RemoveRequest(path="new"), headers=HEADERS)
    assert err.value.code is Code.NOT_FOUND


async def test_watch_dir_streams_start_then_events_with_entries(env: Env) -> None:
    stream = env.client.watch_dir(pb.WatchDirRequest(path="sub", include_entry=True), headers=HEADERS)
    first = await anext(stream)
    assert first.event is not None and first.event.field == "start"
    await env.agent.write_file("s", "/home/user/sub/c.txt", b"ccc")
    await env.agent.fs("s", mp.FsRequest(op="delete", path="/home/user/sub/b.txt"))
    created = await anext(stream)
    assert created.event is not None and created.event.field == "filesystem"
    change = created.event.value
    assert isinstance(change, pb.FilesystemEvent)
    assert (change.name, change.type) == ("c.txt", pb.EventType.CREATE)
    assert change.entry is not None and (change.entry.path, change.entry.size) == ("/home/user/sub/c.txt", 3)
    removed = await anext(stream)
    assert removed.event is not None
    assert isinstance(removed.event.value, pb.FilesystemEvent)
    assert (removed.event.value.name, removed.event.value.type, removed.event.value.entry) == (
        "b.txt",
        pb.EventType.REMOVE,
        None,
    )
    await stream.aclose()  # type: ignore[attr-defined]
    await until(lambda: env.agent.closed_streams == 1 and env.agent.watches == [])


async def test_watch_dir_keepalive_and_missing_dir(env: Env) -> None:
    headers = {**HEADERS, "Keepalive-Ping-Interval": "0.05"}
    stream = env.client.watch_dir(pb.WatchDirRequest(path="sub"), headers=headers)
    assert [(await anext(stream)).event.field for _ in range(2)] == ["start", "keepalive"]  # type: ignore[union-attr]
    await stream.aclose()  # type: ignore[attr-defined]
    with pytest.raises(ConnectError) as err:
        async for _ in env.client.watch_dir(pb.WatchDirRequest(path="nope"), headers=HEADERS):
            pass
    assert err.value.code is Code.NOT_FOUND


async def test_watcher_trio(env: Env) -> None:
    created = await env.client.create_watcher(pb.CreateWatcherRequest(path="sub", include_entry=True), headers=HEADERS)
    ref = WatcherRef.decode(created.watcher_id)
    assert (ref.guest_id, ref.path, ref.include_entry) == ("g1", "/home/user/sub", True)
    await env.agent.write_file("s", "/home/user/sub/b.txt", b"bbbb")
    got = await env.client.get_watcher_events(
        pb.GetWatcherEventsRequest(watcher_id=created.watcher_id), headers=HEADERS
    )
    assert [(e.name, e.type, e.entry.size if e.entry else None) for e in got.events] == [
        ("b.txt", pb.EventType.WRITE, 4)
    ]
    again = await env.client.get_watcher_events(
        pb.GetWatcherEventsRequest(watcher_id=created.watcher_id), headers=HEADERS
    )
    assert list(again.events) == []
    await env.client.remove_watcher(pb.RemoveWatcherRequest(watcher_id=created.watcher_id), headers=HEADERS)
    for watcher_id in (created.watcher_id, "bogus", "w1.!!!"):
        with pytest.raises(ConnectError) as err:
            await env.client.get_watcher_events(pb.GetWatcherEventsRequest(watcher_id=watcher_id), headers=HEADERS)
        assert err.value.code is Code.NOT_FOUND


def test_entry_info_from_guest_dicts() -> None:
    link = entry_info(
        FsEntry.from_guest(
            {"name": "l", "path": "/l", "type": "symlink", "mode": 0o120777, "symlink_target": "/t", "mtime": 1.5}
        )
    )
    assert (link.type, link.mode, link.permissions, link.symlink_target) == (
        pb.FileType.SYMLINK,
        0o777,
        "Lrwxrwxrwx",
        "/t",
    )
    legacy = entry_info(FsEntry.from_guest({"name": "d", "is_dir": True, "mode": 0o755, "mtime": float("nan")}))
    assert (legacy.type, legacy.permissions, legacy.modified_time) == (pb.FileType.DIRECTORY, "drwxr-xr-x", None)
    with pytest.raises(GuestError):  # a time that is no number is refused where the guest's answer is read
        FsEntry.from_guest({"name": "d", "is_dir": True, "mode": 0o755, "mtime": "bad"})
    assert permissions("file", 0o640) == "-rw-r-----"
