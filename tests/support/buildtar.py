"""Tar archives a build-driver test writes member by member (hostile ones too), and snapshots of directory trees to
assert that nothing outside a target changed."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TarWriter:
    """Members in order; :meth:`bytes` is the archive (plain, or gzip'd with ``gz``)."""

    members: list[tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=list)

    def _info(
        self, name: str, kind: bytes, mode: int, uid: int = 0, gid: int = 0, mtime: int = 1_600_000_000
    ) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.uid, info.gid = uid, gid
        info.mtime = mtime
        return info

    def file(self, name: str, data: bytes = b"", mode: int = 0o644, **meta: int) -> TarWriter:
        info = self._info(name, tarfile.REGTYPE, mode, **meta)
        info.size = len(data)
        self.members.append((info, data))
        return self

    def dir(self, name: str, mode: int = 0o755, **meta: int) -> TarWriter:
        self.members.append((self._info(name, tarfile.DIRTYPE, mode, **meta), None))
        return self

    def symlink(self, name: str, target: str) -> TarWriter:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.members.append((info, None))
        return self

    def hardlink(self, name: str, target: str) -> TarWriter:
        info = self._info(name, tarfile.LNKTYPE, 0o644)
        info.linkname = target
        self.members.append((info, None))
        return self

    def device(self, name: str, major: int = 1, minor: int = 3) -> TarWriter:
        info = self._info(name, tarfile.CHRTYPE, 0o666)
        info.devmajor, info.devminor = major, minor
        self.members.append((info, None))
        return self

    def fifo(self, name: str) -> TarWriter:
        self.members.append((self._info(name, tarfile.FIFOTYPE, 0o640), None))
        return self

    def bytes(self, gz: bool = False) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for info, data in self.members:
                archive.addfile(info, io.BytesIO(data) if data is not None else None)
        raw = buffer.getvalue()
        return gzip.compress(raw) if gz else raw

    def write(self, path: Path, gz: bool = False) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.bytes(gz))
        return path


def tree_state(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every path under ``root``: (mode, uid, mtime_ns, content hash or link target); symlinks not followed."""
    state: dict[str, tuple[int, int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                body = os.readlink(path)
            elif os.path.isfile(path):
                body = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                body = ""
            state[os.path.relpath(path, root)] = (st.st_mode, st.st_uid, st.st_mtime_ns, body)
    return state


def file_state(path: str) -> tuple[int, int, int, str]:
    st = os.lstat(path)
    return (st.st_mode, st.st_uid, st.st_mtime_ns, hashlib.sha256(Path(path).read_bytes()).hexdigest())
