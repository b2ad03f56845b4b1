"""``unpack``: OCI layers applied in order onto the target, by a safe extractor of our own (never ``extractall``).

Policy, member by member (``inputs/layers/000.tar``, ``001.tar``, … are plain tar archives; the host decompressed
them):

* a name with a ``..`` component is refused (the build fails naming it); a leading ``/`` is stripped;
* every path is resolved inside the target root (:func:`.paths.resolve_in_root`): a symbolic link in a parent
  component, absolute or relative, is followed within the root, never out of it; a link at the final component is
  replaced, never written through;
* a hard link must name a member already inside the root (resolved in root, not a directory), else it is refused;
* character and block device nodes are **skipped** with a logged line: images carry them in old ``/dev`` trees that
  ``RUN`` covers with the build VM's ``/dev`` anyway, so failing would refuse working images, and creating them would
  only matter inside this throwaway VM (the containment backstop) or in sandboxes, whose ``/dev`` is mounted over;
* fifos are created; setuid and setgid bits are kept (the tenant is root in its own VM: a setuid binary gives no one
  anything they lack);
* numeric owner, mode and mtime are applied (directory mtimes once the layer is done); ``SCHILY.xattr.*`` extended
  attributes are applied where the file system takes them (a failure is logged, not fatal);
* whiteouts: ``.wh.<name>`` deletes ``<name>`` from the layers below; ``.wh..wh..opq`` empties its directory of
  everything this layer did not write (Docker's order-independent rule).
"""

from __future__ import annotations

import os
import posixpath
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import BuildError
from .paths import resolve_in_root
from .writer import clear, make_parents, remove, set_meta, write_file

Log = Callable[[str], None]
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
LAYER_NAME = re.compile(r"[0-9]+\.tar")
XATTR_PREFIX = "SCHILY.xattr."


@dataclass(frozen=True)
class Limits:
    """Bounds on what an unpack writes, over all its layers (``unpack``'s json may set both)."""

    max_bytes: int = 64 << 30
    max_entries: int = 4_000_000

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Limits:
        default = cls()
        return cls(
            max_bytes=int(data.get("max_bytes", default.max_bytes)),
            max_entries=int(data.get("max_entries", default.max_entries)),
        )


@dataclass
class Budget:
    """What an unpack has written so far."""

    limits: Limits
    bytes: int = 0
    entries: int = 0

    def entry(self, name: str, size: int) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise BuildError(f"more than {self.limits.max_entries} entries in the image's layers (at {name!r})")
        if self.bytes + size > self.limits.max_bytes:
            raise BuildError(f"more than {self.limits.max_bytes} bytes in the image's layers (at {name!r})")

    def remaining(self) -> int:
        return self.limits.max_bytes - self.bytes


def member_path(name: str) -> str:
    """A member's path relative to the root (``""`` for the root itself); ``..`` anywhere is refused."""
    if "\0" in name:
        raise BuildError(f"refused tar member {name!r}: NUL byte in its name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise BuildError(f"refused tar member {name!r}: '..' in its path")
    return "/".join(parts)


@dataclass
class LayerApply:
    """One layer being applied: what it wrote (for opaque directories) and the directory mtimes still to set."""

    root: str
    budget: Budget
    log: Log
    written: set[str] = field(default_factory=set)
    dir_times: list[tuple[str, float]] = field(default_factory=list)

    def apply(self, archive: tarfile.TarFile) -> None:
        for member in archive:
            self.member(archive, member)
        for host, mtime in reversed(self.dir_times):
            if os.path.isdir(host) and not os.path.islink(host):
                os.utime(host, (mtime, mtime), follow_symlinks=False)

    def member(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        rel = member_path(member.name)
        parent, base = posixpath.split(rel)
        if base == OPAQUE:
            self.opaque(parent)
            return
        if base.startswith(WHITEOUT):
            remove(resolve_in_root(self.root, posixpath.join(parent, base[len(WHITEOUT) :])))
            return
        if not rel:
            return  # the root directory itself keeps the target's owner and mode
        if member.ischr() or member.isblk():
            self.log(f"skipped device node /{rel} (devices come from the VM's /dev)")
            return
        self.budget.entry(member.name, member.size if member.isreg() else 0)
        host = resolve_in_root(self.root, rel)
        if host == os.path.abspath(self.root):
            return
        make_parents(self.root, host)
        kept_dir = clear(host, keep_dir=member.isdir())
        if member.isdir():
            if not kept_dir:
                os.mkdir(host, 0o700)
            self.dir_times.append((host, float(member.mtime)))
        elif member.isreg():
            source = archive.extractfile(member)
            if source is None:
                raise BuildError(f"tar member {member.name!r} has no data")
            with source:
                self.budget.bytes += write_file(host, source, self.budget.remaining())
        elif member.issym():
            os.symlink(member.linkname, host)
        elif member.islnk():
            self.hard_link(member, host)
            self.written.add(host)
            return  # a hard link shares its target's inode, owner and mode
        elif member.isfifo():
            os.mkfifo(host, 0o600)
        else:
            self.log(f"skipped /{rel}: unsupported tar member type {member.type!r}")
            return
        set_meta(host, member.uid, member.gid, member.mode, None if member.isdir() else float(member.mtime))
        self.xattrs(host, member)
        self.written.add(host)

    def hard_link(self, member: tarfile.TarInfo, host: str) -> None:
        try:
            target_rel = member_path(member.linkname)
        except BuildError as err:
            raise BuildError(f"refused hard link {member.name!r} -> {member.linkname!r}: '..' in its target") from err
        target = resolve_in_root(self.root, target_rel)
        if not target_rel or not os.path.lexists(target) or os.path.isdir(target) and not os.path.islink(target):
            raise BuildError(
                f"refused hard link {member.name!r} -> {member.linkname!r}: the target is not a file in the image"
            )
        os.link(target, host, follow_symlinks=False)

    def opaque(self, parent: str) -> None:
        host = resolve_in_root(self.root, parent, follow_final=True)
        if os.path.isdir(host) and not os.path.islink(host):
            self.prune(host)

    def prune(self, directory: str) -> None:
        """Remove everything under ``directory`` this layer did not write (keeping the way to what it did)."""
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if path not in self.written:
                remove(path)
            elif os.path.isdir(path) and not os.path.islink(path):
                self.prune(path)

    def xattrs(self, host: str, member: tarfile.TarInfo) -> None:
        for key, value in member.pax_headers.items():
            if not key.startswith(XATTR_PREFIX):
                continue
            name = key[len(XATTR_PREFIX) :]
            try:
                os.setxattr(host, name, value.encode("utf-8", "surrogateescape"), follow_symlinks=False)
            except OSError as err:
                self.log(f"extended attribute {name} of {member.name} not kept: {err.strerror}")


def layer_files(layers_dir: str) -> list[str]:
    """``000.tar``, ``001.tar``, … in ``layers_dir``, in numeric order."""
    try:
        names = [name for name in os.listdir(layers_dir) if LAYER_NAME.fullmatch(name)]
    except FileNotFoundError:
        return []
    return [os.path.join(layers_dir, name) for name in sorted(names, key=lambda n: int(n.split(".")[0]))]


def apply_layer(root: str, tar_path: str, budget: Budget, log: Log) -> None:
    """Apply one plain tar layer onto ``root`` (see the module's policy)."""
    with tarfile.open(tar_path, mode="r|") as archive:
        LayerApply(root, budget, log).apply(archive)


def unpack(root: str, layers_dir: str, limits: Limits, log: Log) -> int:
    """Apply every layer in ``layers_dir`` onto ``root`` in order; the number of layers."""
    budget = Budget(limits)
    files = layer_files(layers_dir)
    for index, path in enumerate(files):
        log(f"unpacking layer {index + 1}/{len(files)} ({os.path.basename(path)})")
        try:
            apply_layer(root, path, budget, log)
        except tarfile.TarError as err:
            raise BuildError(f"layer {os.path.basename(path)}: not a valid tar archive: {err}") from err
    log(f"unpacked {len(files)} layers: {budget.entries} entries, {budget.bytes} bytes")
    return len(files)


__all__ = ["Budget", "LayerApply", "Limits", "apply_layer", "layer_files", "member_path", "unpack"]
