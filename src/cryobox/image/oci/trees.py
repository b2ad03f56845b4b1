"""Read-only file trees an image can be loaded from: a directory, or a tar archive read in place.

Nothing is extracted: a member is opened and streamed. Names are relative, ``/``-separated; a name that leaves
the tree (``..``, an absolute path, a symlink pointing out of a directory) is refused.
"""

from __future__ import annotations

import contextlib
import posixpath
import tarfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol

from ...errors import ImagePullFailed

MAX_LINKS = 16


class Tree(Protocol):
    def exists(self, name: str) -> bool: ...

    def size(self, name: str) -> int: ...

    def open(self, name: str) -> AbstractContextManager[IO[bytes]]: ...


def clean_name(name: str) -> str:
    norm = posixpath.normpath(name)
    if norm.startswith(("/", "../")) or norm in ("..", ".", ""):
        raise ImagePullFailed(f"the image names a file outside it: {name!r}")
    return norm


class DirTree:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.label = str(root)

    def _path(self, name: str) -> Path:
        path = (self.root / clean_name(name)).resolve()
        if not path.is_relative_to(self.root):
            raise ImagePullFailed(f"{name!r} in {self.label} points outside it")
        return path

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        try:
            stream = open(self._path(name), "rb")
        except OSError as exc:
            raise ImagePullFailed(f"{self.label}: cannot read {name}: {exc.strerror}") from exc
        with stream:
            yield stream


class TarTree:
    """A tar archive (plain or compressed: ``tarfile``'s ``r:*``) read member by member, in place."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        try:
            self._tar = tarfile.open(path, "r:*")
        except (OSError, tarfile.TarError) as exc:
            raise ImagePullFailed(f"{path} is not a readable tar archive: {exc}") from exc
        self._members = {clean_name(m.name): m for m in self._tar.getmembers() if not m.isdir()}

    def __enter__(self) -> TarTree:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._tar.close()

    def _member(self, name: str) -> tarfile.TarInfo:
        key = clean_name(name)
        for _ in range(MAX_LINKS):
            member = self._members.get(key)
            if member is None:
                raise ImagePullFailed(f"{self.label} has no {name}")
            if member.issym():
                key = clean_name(posixpath.join(posixpath.dirname(key), member.linkname))
            elif member.islnk():
                key = clean_name(member.linkname)
            elif member.isfile():
                return member
            else:
                raise ImagePullFailed(f"{name} in {self.label} is not a file")
        raise ImagePullFailed(f"{name} in {self.label}: too many links")

    def exists(self, name: str) -> bool:
        return clean_name(name) in self._members

    def size(self, name: str) -> int:
        return self._member(name).size

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        stream = self._tar.extractfile(self._member(name))
        if stream is None:
            raise ImagePullFailed(f"{name} in {self.label} is not a file")
        with stream:
            yield stream


__all__ = ["DirTree", "TarTree", "Tree", "clean_name"]
