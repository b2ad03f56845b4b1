"""``cryobox volume cp SRC DST``: copy files or directories between this machine and a volume, without a sandbox of
yours (``VOLUME:/path`` names a path in a volume; the other side is a local path), through ``cryobox.sdk.Volumes``
(``/v1/volumes/{name}/files``, a system sandbox reads and writes the volume). A directory is copied with everything
in it; symlinks in a volume are skipped (never followed), and a name that would land outside the local destination
is refused."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import InvalidArgument, NotFound
from ..models.volumes import NAME_CHARS
from ..sdk import Volumes

REMOTE = re.compile(rf"^(?P<name>{NAME_CHARS}):(?P<path>.*)$")


@dataclass(frozen=True)
class Remote:
    volume: str
    path: str


@dataclass
class Copied:
    files: int = 0
    bytes: int = 0
    dirs: int = 0
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"files": self.files, "bytes": self.bytes, "dirs": self.dirs, "skipped": self.skipped}


def parse(spec: str) -> Remote | Path:
    """``VOLUME:/path`` (a path in a volume; relative ones are from its root) or a local path. A local path that
    could read as remote is written ``./name:x``."""
    found = REMOTE.match(spec)
    if found is None or spec.startswith(("/", ".")):
        return Path(spec)
    path = found["path"] or "/"
    return Remote(found["name"], path if path.startswith("/") else f"/{path}")


def copy(volumes: Volumes, src: str, dst: str) -> Copied:
    source, target = parse(src), parse(dst)
    if isinstance(source, Remote) == isinstance(target, Remote):
        raise InvalidArgument("copy between a volume (VOLUME:/path) and a local path: exactly one side remote")
    done = Copied()
    if isinstance(target, Remote):
        assert isinstance(source, Path)
        _upload(volumes, source, target, done)
    else:
        assert isinstance(source, Remote) and isinstance(target, Path)
        _download(volumes, source, target, done)
    return done


def _is_dir(volumes: Volumes, remote: Remote) -> bool:
    try:
        return volumes.stat(remote.volume, remote.path).type == "directory"
    except NotFound:
        return False


def _upload(volumes: Volumes, source: Path, target: Remote, done: Copied) -> None:
    if not source.exists():
        raise InvalidArgument(f"{source}: no such file or directory")
    into = target.path.endswith("/") or _is_dir(volumes, target)
    base = str(PurePosixPath(target.path) / source.name) if into else target.path.rstrip("/") or "/"
    if source.is_file():
        volumes.write_file(target.volume, base, source.read_bytes())
        done.files, done.bytes = done.files + 1, done.bytes + source.stat().st_size
        return
    volumes.make_dir(target.volume, base, parents=True)
    done.dirs += 1
    for root, dirs, files in os.walk(source):
        rel = PurePosixPath(base) / Path(root).relative_to(source).as_posix()
        for name in sorted(dirs):
            volumes.make_dir(target.volume, str(rel / name), parents=True)
            done.dirs += 1
        for name in sorted(files):
            local = Path(root) / name
            if local.is_symlink() or not local.is_file():
                done.skipped.append(str(local))
                continue
            volumes.write_file(target.volume, str(rel / name), local.read_bytes())
            done.files, done.bytes = done.files + 1, done.bytes + local.stat().st_size


def _download(volumes: Volumes, source: Remote, target: Path, done: Copied) -> None:
    entry = volumes.stat(source.volume, source.path)
    name = PurePosixPath(source.path).name or source.volume
    dest = target / name if target.is_dir() else target
    if entry.type == "file":
        _save(dest, volumes.read_file(source.volume, source.path), done)
        return
    if entry.type != "directory":
        raise InvalidArgument(f"{source.volume}:{source.path} is a {entry.type}: only files and directories are copied")
    dest.mkdir(parents=True, exist_ok=True)
    done.dirs += 1
    root = dest.resolve()
    prefix = source.path.rstrip("/") + "/"
    for item in volumes.list_files(source.volume, source.path, depth=64):
        rel = item.path[len(prefix) :] if item.path.startswith(prefix) else ""
        local = (dest / rel).resolve()
        if not rel or not local.is_relative_to(root):
            raise InvalidArgument(f"{item.path!r} would land outside {dest}", details={"path": item.path})
        if item.type == "directory":
            local.mkdir(parents=True, exist_ok=True)
            done.dirs += 1
        elif item.type == "file":
            local.parent.mkdir(parents=True, exist_ok=True)
            _save(local, volumes.read_file(source.volume, item.path), done)
        else:
            done.skipped.append(item.path)


def _save(path: Path, data: bytes, done: Copied) -> None:
    path.write_bytes(data)
    done.files, done.bytes = done.files + 1, done.bytes + len(data)
