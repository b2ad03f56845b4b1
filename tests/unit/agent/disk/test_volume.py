"""Reflink volume: sparse copies, clone fallback, mountinfo parsing, and the mkfs/mount sequence (no root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cryobox.agent.disk import volume
from cryobox.agent.disk.volume import (
    Volume,
    _mounted,
    allocated_bytes,
    clone_file,
    copy_sparse,
    ensure_volume,
    is_mount_point,
    release_volume,
    subprocess_runner,
    supports_reflink,
)
from cryobox.errors import VmmError

MiB = 1 << 20


def sparse_file(path: Path, size: int, data: dict[int, bytes]) -> bytes:
    """Write ``data`` at its offsets into a ``size``-byte sparse file; return the file's full expected content."""
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset, chunk in data.items():
            fh.seek(offset)
            fh.write(chunk)
    expected = bytearray(size)
    for offset, chunk in data.items():
        expected[offset : offset + len(chunk)] = chunk
    return bytes(expected)


def test_supports_reflink_is_a_bool_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "keep").write_bytes(b"x")
    assert isinstance(supports_reflink(tmp_path), bool)
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


def test_copy_sparse_keeps_holes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = {0: os.urandom(4096), 10 * MiB: os.urandom(MiB - 4096), 64 * MiB - 4096: os.urandom(4096)}
    expected = sparse_file(src, 64 * MiB, data)
    dst = tmp_path / "dst"
    copied = copy_sparse(src, dst)
    assert dst.read_bytes() == expected
    assert dst.stat().st_size == 64 * MiB
    assert MiB <= copied < 4 * MiB  # data extents only (rounded to blocks), not the 64 MiB of holes
    assert allocated_bytes(dst) < 4 * MiB
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]  # no temp file left


def test_copy_sparse_of_an_empty_and_an_all_hole_file(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert copy_sparse(tmp_path / "empty", tmp_path / "empty2") == 0
    assert (tmp_path / "empty2").read_bytes() == b""
    sparse_file(tmp_path / "holes", 8 * MiB, {})
    assert copy_sparse(tmp_path / "holes", tmp_path / "holes2") == 0
    assert (tmp_path / "holes2").stat().st_size == 8 * MiB
    assert allocated_bytes(tmp_path / "holes2") == 0


def test_copy_sparse_replaces_atomically(tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"new content")
    (tmp_path / "dst").write_bytes(b"old content that was longer")
    copy_sparse(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "dst").read_bytes() == b"new content"


def test_copy_sparse_across_filesystems(tmp_path: Path) -> None:
    """ext4 -> tmpfs: ``copy_file_range`` refuses (EXDEV); the read/write fallback still keeps holes."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    src = tmp_path / "src"
    expected = sparse_file(src, 32 * MiB, {MiB: os.urandom(MiB), 20 * MiB: bytes(2 * MiB) + os.urandom(4096)})
    dst = shm / f"cryobox-test-{os.getpid()}-{tmp_path.name}"
    try:
        copy_sparse(src, dst)
        assert dst.read_bytes() == expected
        assert allocated_bytes(dst) < 2 * MiB  # the explicit zeros stayed holes too
    finally:
        dst.unlink(missing_ok=True)


def test_clone_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    expected = sparse_file(src, 64 * MiB, {32 * MiB: os.urandom(MiB)})
    dst = tmp_path / "dst"
    method = clone_file(src, dst)
    assert method == ("reflink" if supports_reflink(tmp_path) else "copy")
    assert dst.read_bytes() == expected
    assert allocated_bytes(dst) < 4 * MiB
    with open(src, "r+b") as fh:  # a clone is a copy: changing the source does not change it
        fh.write(b"changed")
    assert dst.read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_clone_file_missing_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        clone_file(tmp_path / "nope", tmp_path / "dst")
    assert list(tmp_path.iterdir()) == []


def test_allocated_bytes(tmp_path: Path) -> None:
    assert allocated_bytes(tmp_path / "missing") == 0
    sparse_file(tmp_path / "sparse", 64 * MiB, {0: os.urandom(MiB)})
    sparse_alloc = allocated_bytes(tmp_path / "sparse")
    assert MiB <= sparse_alloc < 2 * MiB
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "dense").write_bytes(os.urandom(MiB))
    dense_alloc = allocated_bytes(tmp_path / "sub" / "dense")
    assert dense_alloc >= MiB
    (tmp_path / "sub" / "link").symlink_to(tmp_path / "sparse")  # not counted twice
    (tmp_path / "dirlink").symlink_to(tmp_path / "sub", target_is_directory=True)  # not followed
    assert allocated_bytes(tmp_path) == sparse_alloc + dense_alloc
    assert allocated_bytes(tmp_path / "sub") == dense_alloc


MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684084k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
301 27 7:0 / /tmp/my\040data/vol rw,relatime - xfs /dev/loop0 rw,attr2,inode64
302 27 7:1 / /tmp/tab\011and\134backslash rw,relatime - xfs /dev/loop1 rw
303 27 0:99 /sub /srv/bind\012line rw shared:5 master:1 - ext4 /dev/vda rw

"""


def test_mountinfo_parsing(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert _mounted(Path("/tmp/my data/vol"), info) == ("xfs", "/dev/loop0")  # octal escapes decoded
    assert _mounted(Path("/tmp/tab\tand\\backslash"), info) == ("xfs", "/dev/loop1")
    assert _mounted(Path("/srv/bind\nline"), info) == ("ext4", "/dev/vda")  # optional fields before the "-"
    assert _mounted(Path("/proc"), info) == ("proc", "proc")
    assert _mounted(Path("/tmp"), info) is None
    info.write_text(MOUNTINFO + "304 22 0:100 / /proc rw - tmpfs over rw\n")
    assert _mounted(Path("/proc"), info) == ("tmpfs", "over")  # the last mount over a point is the one seen
    info.write_text("")
    assert _mounted(Path("/"), info) is None


def test_is_mount_point(tmp_path: Path) -> None:
    assert is_mount_point(Path("/proc"))
    assert is_mount_point(Path("/"))
    assert not is_mount_point(tmp_path)
    assert not is_mount_point(tmp_path / "missing")
    (tmp_path / "proc").symlink_to("/proc")
    assert is_mount_point(tmp_path / "proc")  # symlinks are resolved


def test_subprocess_runner_errors_name_the_command() -> None:
    subprocess_runner(["true"])
    with pytest.raises(VmmError, match=r"sh -c .* failed with exit code 3: boom") as failed:
        subprocess_runner(["sh", "-c", "echo boom >&2; exit 3"])
    assert failed.value.details["exit_code"] == 3
    with pytest.raises(VmmError, match="no-such-mkfs not found.*xfsprogs"):
        subprocess_runner(["no-such-mkfs", "-q"])


class FakeHost:
    """A fake :data:`Runner` plus fake mount state: records argv, "mounts" on ``mount``, can fail on demand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, data_dir_reflink: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.mounted: set[Path] = set()
        self.fail: dict[str, int] = {}  # argv[0] (or "umount -l") -> how many more calls fail
        self.volume_reflink = True
        self.data_dir_reflink = data_dir_reflink
        self.fstype = "xfs"
        self.probed: list[Path] = []
        monkeypatch.setattr(volume, "is_mount_point", lambda path: path in self.mounted)
        monkeypatch.setattr(volume, "_mounted", lambda path: (self.fstype, None) if path in self.mounted else None)
        monkeypatch.setattr(volume, "supports_reflink", self.supports_reflink)
        monkeypatch.setattr(volume, "UMOUNT_RETRY_DELAY_S", 0.0)

    def supports_reflink(self, directory: Path) -> bool:
        self.probed.append(directory)
        return self.volume_reflink if directory in self.mounted else self.data_dir_reflink

    def __call__(self, argv: list[str]) -> None:
        self.calls.append(argv)
        if self.fail.get(argv[0], 0) > 0:
            self.fail[argv[0]] -= 1
            raise VmmError(f"{' '.join(argv)} failed: target is busy")
        if argv[0] == "mount":
            self.mounted.add(Path(argv[-1]))
        elif argv[0] == "umount":
            self.mounted.discard(Path(argv[-1]))


def test_ensure_volume_on_a_reflink_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch, data_dir_reflink=True)
    vol = ensure_volume(tmp_path / "data", runner=host)
    assert vol == Volume(tmp_path / "data" / "vol", None, True)
    assert vol.root.is_dir()
    assert host.calls == []


def test_ensure_volume_creates_formats_and_mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch)
    image, root = tmp_path / "volume.xfs", tmp_path / "vol"
    vol = ensure_volume(tmp_path, size_gib=3, runner=host)
    assert vol == Volume(root, image, True)
    mkfs, mount = host.calls
    assert mkfs[:4] == ["mkfs.xfs", "-q", "-m", "reflink=1"] and len(mkfs) == 5
    tmp_image = Path(mkfs[4])
    assert tmp_image.parent == tmp_path and tmp_image != image  # formatted under a temporary name
    assert mount == ["mount", "-o", "loop", str(image), str(root)]
    assert image.stat().st_size == 3 << 30 and allocated_bytes(image) == 0  # sparse
    assert not tmp_image.exists()

    # mounted already (e.g. after an agent crash): reused as is, and not probed again (probed when mounted)
    host.probed.clear()
    assert ensure_volume(tmp_path, size_gib=3, runner=host) == vol
    assert len(host.calls) == 2
    assert host.probed == [tmp_path]  # the data dir's own file system only

    # image exists but is not mounted (e.g. after a reboot): mounted, not formatted again
    assert release_volume(tmp_path, runner=host) is True
    host.calls.clear()
    assert ensure_volume(tmp_path, size_gib=3, runner=host) == vol
    assert host.calls == [["mount", "-o", "loop", str(image), str(root)]]


def test_ensure_volume_mkfs_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch)
    host.fail["mkfs.xfs"] = 1
    with pytest.raises(VmmError, match="mkfs.xfs"):
        ensure_volume(tmp_path, runner=host)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".volume.lock"]  # no image, half-made or otherwise
    assert [argv[0] for argv in host.calls] == ["mkfs.xfs"]


def test_ensure_volume_without_reflink_unmounts_and_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch)
    host.volume_reflink = False
    with pytest.raises(VmmError, match="does not support reflink"):
        ensure_volume(tmp_path, runner=host)
    assert [argv[0] for argv in host.calls] == ["mkfs.xfs", "mount", "umount"]
    assert host.mounted == set()


def test_a_mount_in_place_that_is_not_xfs_is_probed_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = FakeHost(monkeypatch)
    host.mounted.add(tmp_path / "vol")  # someone else's mount where the volume goes
    host.fstype, host.volume_reflink = "ext4", False
    with pytest.raises(VmmError, match="does not support reflink"):
        ensure_volume(tmp_path, runner=host)
    assert host.probed == [tmp_path, tmp_path / "vol"]


def test_ensure_volume_refuses_to_hide_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch)
    (tmp_path / "vol").mkdir()
    (tmp_path / "vol" / "stray").write_bytes(b"x")
    with pytest.raises(VmmError, match="not empty"):
        ensure_volume(tmp_path, runner=host)
    assert host.mounted == set()


def test_release_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch)
    root = str(tmp_path / "vol")
    assert release_volume(tmp_path / "never-created", runner=host) is False
    assert release_volume(tmp_path, runner=host) is False
    assert host.calls == []

    ensure_volume(tmp_path, runner=host)
    host.calls.clear()
    host.fail["umount"] = 2  # busy twice, then it goes
    assert release_volume(tmp_path, runner=host) is True
    assert host.calls == [["umount", root]] * 3
    assert (tmp_path / "volume.xfs").exists()  # never deleted
    assert release_volume(tmp_path, runner=host) is False


def test_release_volume_falls_back_to_lazy_umount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch)
    ensure_volume(tmp_path, runner=host)
    host.calls.clear()
    host.fail["umount"] = volume.UMOUNT_ATTEMPTS
    assert release_volume(tmp_path, runner=host) is True
    assert host.calls == [["umount", str(tmp_path / "vol")]] * volume.UMOUNT_ATTEMPTS + [
        ["umount", "-l", str(tmp_path / "vol")]
    ]
    assert host.mounted == set()
