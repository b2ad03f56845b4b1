"""Reading uploaded contexts within limits, and writing deterministic context blobs."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from cryobox.errors import InvalidArgument, PayloadTooLarge
from cryobox.image.recipe.tarblob import ContextLimits, Entry, member_name, read_context, write_blob
from tests.support.contexttar import Member, blob_members, context_tar

LIMITS = ContextLimits()


class OneWay(io.RawIOBase):
    """A stream that cannot seek, as a request body is."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        chunk = self._inner.read(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)


def test_reads_plain_and_gzip_streams_from_non_seekable_input() -> None:
    members = [
        Member("./", kind=tarfile.DIRTYPE, mode=0o755),
        Member("./app/", kind=tarfile.DIRTYPE, mode=0o755),
        Member("./app/main.py", b"print(1)\n", mode=0o755),
        Member("app/link", kind=tarfile.SYMTYPE, linkname="main.py"),
        Member("app/hard", kind=tarfile.LNKTYPE, linkname="./app/main.py"),
    ]
    for gzipped in (False, True):
        entries = read_context(io.BufferedReader(OneWay(context_tar(members, gzipped=gzipped))), LIMITS)
        assert sorted(entries) == ["app", "app/hard", "app/link", "app/main.py"]
        assert entries["app/main.py"] == Entry("app/main.py", "file", 0o755, 1_700_000_000, b"print(1)\n")
        assert entries["app/hard"].kind == "file" and entries["app/hard"].data == b"print(1)\n"
        assert entries["app/link"].kind == "symlink" and entries["app/link"].linkname == "main.py"


def test_reads_a_path(tmp_path: Path) -> None:
    path = tmp_path / "ctx.tar.gz"
    path.write_bytes(context_tar([Member("a", b"x")], gzipped=True))
    assert read_context(path, LIMITS)["a"].data == b"x"


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ([Member("/etc/passwd", b"x")], "absolute"),
        ([Member("a/../../b", b"x")], "leaves the context"),
        ([Member("dev", kind=tarfile.CHRTYPE)], "device node or a fifo"),
        ([Member("fifo", kind=tarfile.FIFOTYPE)], "device node or a fifo"),
        ([Member("h", kind=tarfile.LNKTYPE, linkname="missing")], "hard link"),
    ],
)
def test_refused_members(members: list[Member], needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        read_context(io.BytesIO(context_tar(members)), LIMITS)


def test_not_a_tar() -> None:
    with pytest.raises(InvalidArgument, match="not a readable tar"):
        read_context(io.BytesIO(b"hello, not a tar" * 100), LIMITS)


@pytest.mark.parametrize(
    ("limits", "what"),
    [
        (ContextLimits(max_members=2), "members"),
        (ContextLimits(max_file_bytes=3), "file_bytes"),
        (ContextLimits(max_total_bytes=5), "total_bytes"),
    ],
)
def test_limits(limits: ContextLimits, what: str) -> None:
    members = [Member("a", b"abc"), Member("b", b"abc"), Member("c", b"abcd")]
    with pytest.raises(PayloadTooLarge) as info:
        read_context(io.BytesIO(context_tar(members)), limits)
    assert info.value.details["what"] == what
    assert info.value.details["limit"] == getattr(limits, f"max_{what}")
    assert info.value.http_status == 413 and info.value.code == "payload_too_large"


def test_hard_links_count_against_the_total() -> None:
    members = [Member("a", b"abc"), Member("b", kind=tarfile.LNKTYPE, linkname="a")]
    with pytest.raises(PayloadTooLarge):
        read_context(io.BytesIO(context_tar(members)), ContextLimits(max_total_bytes=5))


def test_member_name() -> None:
    assert member_name("./a//b/") == "a/b"
    assert member_name(".") == ""


def test_write_blob_is_deterministic_and_normalised() -> None:
    entries = [
        Entry("b", "file", 0o600, 5, b"bee"),
        Entry("a", "dir", 0o755, 7),
        Entry("a/l", "symlink", 0o777, 9, linkname="../b"),
    ]
    blob = write_blob(entries)
    assert blob == write_blob(reversed(entries))
    assert blob[4:8] == b"\0\0\0\0"  # gzip mtime
    members = blob_members(blob)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert [m.name.rstrip("/") for m in tar.getmembers()] == ["a", "a/l", "b"]
    assert members["b"].mode == 0o600 and members["b"].mtime == 5
    assert members["a"].isdir() and members["a/l"].issym() and members["a/l"].linkname == "../b"
    assert all((m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "") for m in members.values())
