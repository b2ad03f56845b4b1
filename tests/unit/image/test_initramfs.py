"""NewcWriter output, checked with an independent newc parser."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cryobox.image.initramfs import NewcWriter

HEADER_LEN = 110
FIELDS = (
    "ino",
    "mode",
    "uid",
    "gid",
    "nlink",
    "mtime",
    "filesize",
    "devmajor",
    "devminor",
    "rdevmajor",
    "rdevminor",
    "namesize",
    "check",
)


@dataclass(frozen=True)
class Entry:
    name: str
    fields: dict[str, int]
    data: bytes

    @property
    def mode(self) -> int:
        return self.fields["mode"]


def _align4(n: int) -> int:
    return (n + 3) & ~3


def parse_newc(buf: bytes) -> list[Entry]:
    entries: list[Entry] = []
    pos = 0
    while True:
        assert pos % 4 == 0
        header = buf[pos : pos + HEADER_LEN]
        assert len(header) == HEADER_LEN, "truncated header"
        assert header[:6] == b"070701", f"bad magic at {pos}: {header[:6]!r}"
        raw = header[6:]
        fields = {name: int(raw[i * 8 : i * 8 + 8], 16) for i, name in enumerate(FIELDS)}
        name_start = pos + HEADER_LEN
        name_bytes = buf[name_start : name_start + fields["namesize"]]
        assert name_bytes.endswith(b"\0") and b"\0" not in name_bytes[:-1]
        name_end = name_start + fields["namesize"]
        assert buf[name_end : _align4(name_end)] == b"\0" * (_align4(name_end) - name_end)
        data_start = _align4(name_end)
        data_end = data_start + fields["filesize"]
        data = buf[data_start:data_end]
        assert len(data) == fields["filesize"], "truncated data"
        assert buf[data_end : _align4(data_end)] == b"\0" * (_align4(data_end) - data_end)
        pos = _align4(data_end)
        entry = Entry(name=name_bytes[:-1].decode(), fields=fields, data=data)
        entries.append(entry)
        if entry.name == "TRAILER!!!":
            assert pos == len(buf), "bytes after the trailer"
            return entries


def test_round_trip() -> None:
    writer = NewcWriter()
    writer.directory("bin")
    writer.directory("lib/modules")
    writer.file("bin/busybox", b"\x7fELF busybox", 0o755)
    writer.file("init", b"#!/bin/busybox sh\necho hi\n", 0o755)
    writer.file("lib/modules/order", b"virtio_ring\nvirtio\n")
    buf = writer.finish()

    assert len(buf) % 4 == 0
    entries = parse_newc(buf)
    assert [e.name for e in entries] == ["bin", "lib/modules", "bin/busybox", "init", "lib/modules/order", "TRAILER!!!"]
    by_name = {e.name: e for e in entries}

    assert by_name["bin"].mode == 0o040755
    assert by_name["lib/modules"].mode == 0o040755
    assert by_name["bin"].data == b""
    assert by_name["bin/busybox"].mode == 0o100755
    assert by_name["bin/busybox"].data == b"\x7fELF busybox"
    assert by_name["init"].mode == 0o100755
    assert by_name["init"].data == b"#!/bin/busybox sh\necho hi\n"
    assert by_name["lib/modules/order"].mode == 0o100644
    assert by_name["lib/modules/order"].data == b"virtio_ring\nvirtio\n"

    trailer = entries[-1]
    assert trailer.data == b""
    assert trailer.fields["namesize"] == len(b"TRAILER!!!\0")

    inodes = [e.fields["ino"] for e in entries]
    assert len(set(inodes)) == len(inodes)
    for e in entries[:-1]:
        assert e.fields["nlink"] == 1
        assert e.fields["uid"] == 0 and e.fields["gid"] == 0
        assert e.fields["check"] == 0


@pytest.mark.parametrize("name_len", range(1, 9))
@pytest.mark.parametrize("data_len", range(9))
def test_padding(name_len: int, data_len: int) -> None:
    writer = NewcWriter()
    name = "n" * name_len
    data = bytes(range(1, data_len + 1))
    writer.file(name, data)
    writer.file("after", b"xyz")
    entries = parse_newc(writer.finish())
    assert [(e.name, e.data) for e in entries] == [(name, data), ("after", b"xyz"), ("TRAILER!!!", b"")]


def test_deterministic() -> None:
    def build() -> bytes:
        writer = NewcWriter()
        writer.directory("dev")
        writer.file("init", b"x", 0o755)
        return writer.finish()

    assert build() == build()
