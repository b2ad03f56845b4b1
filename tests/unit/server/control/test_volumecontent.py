"""The volume content API's service: the program it runs in the guest (here run by a local python3 over a real
directory standing for the mounted volume: the same bytes the system sandbox runs), who may hold the volume
meanwhile, and the system sandbox's life (made once, reused, deleted when idle or when a create wants the volume),
on an injected clock."""

from __future__ import annotations

import asyncio
import base64
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from cryobox.agentapi import models as am
from cryobox.errors import InvalidArgument, NotFound, StateError
from cryobox.registry.volumes import VolumeAttachment, VolumeRow
from cryobox.server.control.volumecontent import MOUNT, Meta, VolumeContent
from cryobox.server.control.volumes import MountRequest
from tests.support.clock import FakeClock


class LocalGuest:
    """An agent whose one sandbox's volume is ``root``: exec runs the given program with a local python3."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.execs = 0

    def _here(self, path: str) -> Path:
        return self.root / os.path.relpath(path, MOUNT) if path.startswith(MOUNT) else Path(path)

    async def exec(self, sandbox_id: str, request: am.ExecRequest) -> am.ExecResult:
        self.execs += 1
        argv = [
            sys.executable if a == "python3" else str(self.root) if a == MOUNT else a for a in shlex.split(request.cmd)
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate(base64.b64decode(request.stdin_b64 or ""))
        assert request.user == "root"
        return am.ExecResult(exit_code=proc.returncode or 0, stdout=out.decode(), stderr=err.decode(), duration_ms=1.0)

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._here(path).read_bytes()

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> None:
        self._here(path).write_bytes(data)


@dataclass
class Maker:
    guest: LocalGuest
    made: list[tuple[str, bool]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    async def make(self, row: VolumeRow, mount: MountRequest) -> tuple[str, LocalGuest]:
        assert mount.path == MOUNT and mount.name == row.name
        self.made.append((f"sys-{len(self.made)}", mount.read_only))
        return self.made[-1][0], self.guest

    async def remove(self, sandbox_id: str, workspace_id: str) -> None:
        self.removed.append(sandbox_id)


ROW = VolumeRow(id="vol-1", workspace_id="ws", name="data", size_bytes=1 << 26, host="a", created_at=0.0)


@dataclass
class Env:
    content: VolumeContent
    maker: Maker
    clock: FakeClock
    root: Path


@pytest.fixture
def env(tmp_path: Path) -> Env:
    root = tmp_path / "volume"
    root.mkdir()
    os.chown(root, 1000, 1000)
    clock = FakeClock(100.0)
    maker = Maker(LocalGuest(root))
    return Env(VolumeContent(maker, clock, idle_s=15.0), maker, clock, root)  # type: ignore[arg-type]


def attached(sandbox_id: str, *, read_only: bool) -> VolumeRow:
    return replace(ROW, attachments=(VolumeAttachment("vol-1", sandbox_id, "/d", read_only, 0.0),))


async def test_files_dirs_listing_and_metadata_as_the_volume_holds_them(env: Env) -> None:
    content, maker, root = env.content, env.maker, env.root
    made = await content.write(ROW, "/hello.txt", b"hi", Meta(), force=None)
    assert (made["type"], made["path"], made["size"], made["uid"], made["gid"], made["mode"]) == (
        "file", "/hello.txt", 2, 1000, 1000, 0o644,
    )  # fmt: skip
    await content.mkdir(ROW, "/a/b", Meta(uid=0, gid=0, mode=0o700), force=True)
    await content.write(ROW, "/a/b/c.bin", bytes(range(256)), Meta(mode=0o600), force=None)
    os.symlink("/etc", root / "a" / "link")
    listed = await content.list(ROW, "/", depth=3)
    assert [(e["path"], e["type"]) for e in listed] == [
        ("/a", "directory"), ("/a/b", "directory"), ("/a/b/c.bin", "file"), ("/a/link", "symlink"),
        ("/hello.txt", "file"),
    ]  # fmt: skip
    assert next(e for e in listed if e["path"] == "/a/link")["target"] == "/etc"
    assert [e["path"] for e in await content.list(ROW, "/", depth=1)] == ["/a", "/hello.txt"]
    assert await content.read(ROW, "/a/b/c.bin") == bytes(range(256))
    stat = await content.stat(ROW, "/a/b")
    assert (stat["uid"], stat["gid"], stat["mode"]) == (0, 0, 0o700)
    changed = await content.chmeta(ROW, "/hello.txt", Meta(mode=0o640))
    assert changed["mode"] == 0o640 and (root / "hello.txt").stat().st_mode & 0o777 == 0o640
    with pytest.raises(StateError):
        await content.write(ROW, "/hello.txt", b"x", Meta(), force=False)  # no overwrite asked
    with pytest.raises(StateError):
        await content.mkdir(ROW, "/a", Meta(), force=False)
    with pytest.raises(NotFound):
        await content.mkdir(ROW, "/x/y", Meta(), force=False)
    with pytest.raises(NotFound):
        await content.write(ROW, "/nope/f", b"x", Meta(), force=None)
    await content.remove(ROW, "/a")
    assert sorted(p.name for p in root.iterdir()) == ["hello.txt"]
    with pytest.raises(NotFound):
        await content.stat(ROW, "/a")
    assert maker.made == [("sys-0", False)], "one system sandbox for all of it"


async def test_no_path_leaves_the_volume(env: Env, tmp_path: Path) -> None:
    content, root = env.content, env.root
    (tmp_path / "secret").write_text("host file")
    os.symlink(tmp_path, root / "out")
    for path in ("/out/secret", "/out/new"):
        with pytest.raises(InvalidArgument):
            await content.read(ROW, path)
        with pytest.raises(InvalidArgument):
            await content.write(ROW, path, b"x", Meta(), force=None)
    with pytest.raises(InvalidArgument):
        await content.read(ROW, "/../secret")
    os.symlink(tmp_path / "secret", root / "link")
    await content.write(ROW, "/link", b"mine", Meta(), force=None)  # replaces the link, never writes through it
    assert (tmp_path / "secret").read_text() == "host file" and (root / "link").read_bytes() == b"mine"
    with pytest.raises(InvalidArgument):
        await content.remove(ROW, "/")


async def test_who_may_hold_the_volume_meanwhile(env: Env) -> None:
    content, maker, root = env.content, env.maker, env.root
    (root / "f").write_bytes(b"x")
    with pytest.raises(StateError, match="read-write by sandbox sb-w"):
        await content.read(attached("sb-w", read_only=False), "/f")
    assert maker.made == [], "nothing made while another sandbox writes it"
    readers = attached("sb-r", read_only=True)
    assert await content.read(readers, "/f") == b"x"
    assert maker.made == [("sys-0", True)], "read-only beside readers"
    with pytest.raises(StateError, match="read-only by sandboxes"):
        await content.write(readers, "/g", b"y", Meta(), force=None)
    assert await content.write(ROW, "/g", b"y", Meta(), force=None)  # the readers went: a read-write one instead
    assert maker.made[-1] == ("sys-1", False) and maker.removed == ["sys-0"]


async def test_the_system_sandbox_goes_when_idle_or_when_a_create_wants_the_volume(env: Env) -> None:
    content, maker, clock = env.content, env.maker, env.clock
    await content.mkdir(ROW, "/d", Meta(), force=True)
    clock.advance(10.0)
    assert await content.sweep() == [] and maker.removed == []
    await content.stat(ROW, "/d")  # used again: idle from now
    clock.advance(14.0)
    assert await content.sweep() == []
    clock.advance(1.0)
    assert await content.sweep() == ["vol-1"] and maker.removed == ["sys-0"]
    assert content.system_sandboxes() == set()
    await content.stat(ROW, "/d")
    assert await content.evict("vol-1") is True and maker.removed == ["sys-0", "sys-1"]
    assert await content.evict("vol-1") is False
