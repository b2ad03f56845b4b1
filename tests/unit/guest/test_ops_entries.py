"""Richer file ops: entries (type, permissions, owner, symlinks), deep listings, mkdir/move/write as a user."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.guest.agent import GuestAgent
from cryobox.guest.ops_entries import go_mode_string
from tests.support.guest import Client, Harness, b64

ENTRY_KEYS = {
    "name",
    "is_dir",
    "size",
    "mode",
    "mtime",
    "path",
    "type",
    "permissions",
    "owner",
    "group",
    "symlink_target",
}


@pytest.fixture
def client() -> Iterator[Client]:
    h = Harness(GuestAgent(clock_setter=lambda ns: None))
    yield h.client
    h.close()


def me() -> tuple[str, str]:
    return pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name


def owned_by(path: Path, user: pwd.struct_passwd) -> bool:
    st = path.lstat()
    return (st.st_uid, st.st_gid) == (user.pw_uid, user.pw_gid)


def test_go_mode_strings() -> None:
    assert go_mode_string(stat.S_IFREG | 0o644) == "-rw-r--r--"
    assert go_mode_string(stat.S_IFDIR | 0o755) == "drwxr-xr-x"
    assert go_mode_string(stat.S_IFLNK | 0o777) == "Lrwxrwxrwx"
    assert go_mode_string(stat.S_IFDIR | stat.S_ISVTX | 0o777) == "dtrwxrwxrwx"
    assert go_mode_string(stat.S_IFREG | stat.S_ISUID | 0o755) == "urwxr-xr-x"
    assert go_mode_string(stat.S_IFREG | stat.S_ISGID | 0o750) == "grwxr-x---"
    assert go_mode_string(stat.S_IFCHR | 0o666) == "Dcrw-rw-rw-"
    assert go_mode_string(stat.S_IFBLK | 0o660) == "Drw-rw----"
    assert go_mode_string(stat.S_IFIFO | 0o600) == "prw-------"
    assert go_mode_string(stat.S_IFSOCK | 0o755) == "Srwxr-xr-x"
    assert go_mode_string(stat.S_IFREG) == "----------"


def test_stat_file_and_dir(client: Client, tmp_path: Path) -> None:
    owner, group = me()
    f = tmp_path / "f.txt"
    f.write_bytes(b"12345")
    f.chmod(0o640)
    st = client.ok("stat", {"path": str(f)})
    assert set(st) == ENTRY_KEYS
    assert st == {
        "name": "f.txt",
        "path": str(f),
        "type": "file",
        "is_dir": False,
        "size": 5,
        "mode": 0o640,
        "mtime": st["mtime"],
        "permissions": "-rw-r-----",
        "owner": owner,
        "group": group,
        "symlink_target": None,
    }
    assert abs(st["mtime"] - f.stat().st_mtime) < 1e-3
    os.chown(f, 54321, 54322)  # ids without a name: the number
    assert (client.ok("stat", {"path": str(f)})["owner"], client.ok("stat", {"path": str(f)})["group"]) == (
        "54321",
        "54322",
    )
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0o1777)
    st = client.ok("stat", {"path": str(d)})
    assert (st["type"], st["is_dir"], st["permissions"]) == ("dir", True, "dtrwxrwxrwx")


def test_stat_does_not_follow_a_final_symlink_for_the_type(client: Client, tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "data").write_bytes(b"x" * 100)
    (tmp_path / "to-dir").symlink_to(tmp_path / "target")
    (tmp_path / "to-file").symlink_to("data")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    to_dir = client.ok("stat", {"path": str(tmp_path / "to-dir")})
    assert to_dir["type"] == "symlink" and to_dir["is_dir"] is True
    assert to_dir["symlink_target"] == str(tmp_path / "target") and to_dir["permissions"] == "Lrwxrwxrwx"
    to_file = client.ok("stat", {"path": str(tmp_path / "to-file")})
    assert (to_file["type"], to_file["is_dir"], to_file["size"], to_file["symlink_target"]) == (
        "symlink",
        False,
        100,  # the target's size
        "data",
    )
    dangling = client.ok("stat", {"path": str(tmp_path / "dangling")})
    assert dangling["type"] == "symlink" and dangling["is_dir"] is False
    assert dangling["size"] == len(str(tmp_path / "missing"))  # the link itself


def test_list_dir_entries_and_depth(client: Client, tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x").write_bytes(b"1")
    (tmp_path / "a" / "b" / "y").write_bytes(b"22")
    (tmp_path / "link").symlink_to(tmp_path / "a")  # a symlinked directory is listed, never descended into
    (tmp_path / "z.txt").write_bytes(b"")

    def paths(depth: int | None) -> list[str]:
        args: dict[str, object] = {"path": str(tmp_path)}
        if depth is not None:
            args["depth"] = depth
        listing = client.ok("list_dir", args)
        assert listing["path"] == str(tmp_path)
        assert all(set(e) == ENTRY_KEYS for e in listing["entries"])
        assert all(e["path"] == os.path.join(os.path.dirname(e["path"]), e["name"]) for e in listing["entries"])
        return [os.path.relpath(e["path"], tmp_path) for e in listing["entries"]]

    assert paths(None) == paths(1) == ["a", "link", "z.txt"]
    assert paths(2) == ["a", "a/b", "a/x", "link", "z.txt"]
    assert paths(3) == paths(10) == ["a", "a/b", "a/b/y", "a/x", "link", "z.txt"]
    entries = {e["name"]: e for e in client.ok("list_dir", {"path": str(tmp_path), "depth": 3})["entries"]}
    assert entries["link"]["type"] == "symlink" and entries["link"]["is_dir"] is True
    assert entries["y"]["size"] == 2 and entries["y"]["path"] == str(tmp_path / "a" / "b" / "y")
    assert entries["b"]["type"] == "dir"
    for bad in (0, -1, "2", True):
        assert client.error_code("list_dir", {"path": str(tmp_path), "depth": bad}) == "invalid_argument"


def test_mkdir_reports_created_and_chowns_new_dirs(client: Client, tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    existing = tmp_path / "existing"
    existing.mkdir()
    target = existing / "p" / "q"
    made = client.ok("mkdir", {"path": str(target), "user": "nobody"})
    assert (made["path"], made["created"]) == (str(target), True)
    assert set(made["entry"]) == ENTRY_KEYS
    assert (made["entry"]["path"], made["entry"]["type"], made["entry"]["owner"]) == (str(target), "dir", "nobody")
    assert owned_by(target, nobody) and owned_by(existing / "p", nobody)
    assert not owned_by(existing, nobody)  # it existed: left alone
    again = client.ok("mkdir", {"path": str(target)})
    assert (again["path"], again["created"]) == (str(target), False)
    plain = client.ok("mkdir", {"path": str(tmp_path / "plain")})
    assert (plain["created"], plain["entry"]["owner"]) == (True, me()[0])
    assert (tmp_path / "plain").stat().st_uid == os.getuid()
    assert client.error_code("mkdir", {"path": str(tmp_path / "x"), "user": "no-such-user-here"}) == "invalid_argument"
    assert not (tmp_path / "x").exists()


def test_move(client: Client, tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    src = tmp_path / "src.txt"
    src.write_bytes(b"payload")
    dest = tmp_path / "new" / "deep" / "dest.txt"
    entry = client.ok("move", {"path": str(src), "destination": str(dest), "user": "nobody"})
    assert set(entry) == ENTRY_KEYS
    assert (entry["path"], entry["name"], entry["type"], entry["size"]) == (str(dest), "dest.txt", "file", 7)
    assert not src.exists() and dest.read_bytes() == b"payload"
    assert owned_by(tmp_path / "new", nobody) and owned_by(tmp_path / "new" / "deep", nobody)
    assert not owned_by(dest, nobody)  # the moved file keeps its owner

    d = tmp_path / "dir"
    (d / "inner").mkdir(parents=True)
    moved = client.ok("move", {"path": str(d), "destination": str(tmp_path / "dir2")})
    assert moved["type"] == "dir" and (tmp_path / "dir2" / "inner").is_dir()
    assert client.error_code("move", {"path": str(tmp_path / "missing"), "destination": str(tmp_path / "m")}) == (
        "not_found"
    )
    assert not (tmp_path / "m").exists()
    assert client.error_code("move", {"path": str(dest)}) == "invalid_argument"


def test_write_file_as_user(client: Client, tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    path = tmp_path / "made" / "f.bin"
    reply = client.ok("write_file", {"path": str(path), "content": b64(b"abc"), "mode": 0o640, "user": "nobody"})
    assert reply == {"path": str(path), "bytes": 3}
    assert path.read_bytes() == b"abc" and path.stat().st_mode & 0o7777 == 0o640
    assert owned_by(path, nobody) and owned_by(tmp_path / "made", nobody)
    assert not owned_by(tmp_path, nobody)
    st = client.ok("stat", {"path": str(path)})
    assert st["owner"] == "nobody" and st["group"] == grp.getgrgid(nobody.pw_gid).gr_name
    client.ok("write_file", {"path": str(tmp_path / "root.bin"), "content": b64(b"")})
    assert (tmp_path / "root.bin").stat().st_uid == os.getuid()
