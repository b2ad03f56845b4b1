"""``COPY``: sources from a context blob (a gzip'd tar whose member names are paths relative to the build
context's root) into the target, with Docker's semantics.

* A source is a path or a glob (``*``, ``?``, ``[…]`` match within one path component); it cannot leave the
  context (``..`` stops at its root). A source that matches nothing fails the step.
* A directory source copies its contents (not the directory itself) into ``dest``.
* ``dest`` is a directory when it ends with ``/`` (or is ``.``), when there are several sources (after glob
  expansion), when the source is a directory, or when it already is a directory in the target; otherwise a file
  source is written *as* ``dest``. A relative ``dest`` is resolved against the build's ``WORKDIR``.
* Everything is resolved inside the target root (:func:`.paths.resolve_in_root`); a symbolic link at a written
  path is replaced. Symbolic links in the context are copied as links; hard links as copies of their data; device
  nodes and fifos are skipped.
* New files and directories (``dest`` and the directories created for it too) belong to ``chown`` (``user[:group]``
  resolved in the target) or to 0:0; ``mode`` (octal) replaces the mode of what is copied. Existing directories are
  left as they are.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

from .accounts import resolve_owner
from .errors import BuildError
from .layers import member_path
from .paths import resolve_in_root
from .state import BuildState, StepSpec
from .writer import clear, make_dirs, make_parents, set_meta, write_file

Log = Callable[[str], None]
CONTEXT_NAME = re.compile(r"[0-9a-f]{16,128}")
MAGIC = re.compile(r"[*?\[]")
MAX_FILE = 1 << 40


@dataclass
class Context:
    """The members of a context blob by path (directories named only as parents of members included)."""

    archive: tarfile.TarFile
    entries: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=lambda: {""})

    @classmethod
    def read(cls, archive: tarfile.TarFile) -> Context:
        context = cls(archive)
        for member in archive.getmembers():
            rel = member_path(member.name)
            if not rel:
                continue
            context.entries[rel] = member
            parent = posixpath.dirname(rel)
            while parent and parent not in context.dirs:
                context.dirs.add(parent)
                parent = posixpath.dirname(parent)
            if member.isdir():
                context.dirs.add(rel)
        return context

    def is_dir(self, rel: str) -> bool:
        return rel in self.dirs and (rel not in self.entries or self.entries[rel].isdir())

    def match(self, source: str) -> list[str]:
        """The context paths ``source`` names (one, or a glob's matches in order). :raises BuildError: none."""
        pattern = posixpath.normpath("/" + source).lstrip("/")
        pattern = "" if pattern == "." else pattern
        if not MAGIC.search(pattern):
            if pattern in self.entries or pattern in self.dirs:
                return [pattern]
            raise BuildError(f"COPY source {source!r} is not in the build context")
        want = pattern.split("/")
        found = sorted(
            path
            for path in self.dirs | set(self.entries)
            if path
            and len(parts := path.split("/")) == len(want)
            and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, want, strict=True))
        )
        if not found:
            raise BuildError(f"COPY source {source!r} matches nothing in the build context")
        return found

    def below(self, rel: str) -> list[str]:
        """Every path under directory ``rel``, parents before children."""
        prefix = f"{rel}/" if rel else ""
        return sorted(p for p in self.dirs | set(self.entries) if p and p.startswith(prefix))


@dataclass(frozen=True)
class Placement:
    root: str
    uid: int
    gid: int
    mode: int | None
    log: Log

    def place(self, context: Context, rel: str, dest: str) -> None:
        """Write context path ``rel`` at target path ``dest``."""
        member = context.entries.get(rel)
        if member is None or member.isdir():
            host = resolve_in_root(self.root, dest, follow_final=True)  # an existing directory's link is followed
            created = make_dirs(self.root, host, self.uid, self.gid)
            if created and member is not None:
                mode = self.mode if self.mode is not None else member.mode
                set_meta(host, self.uid, self.gid, mode, float(member.mtime))
            return
        if not (member.isreg() or member.islnk() or member.issym()):
            self.log(f"COPY: skipped {rel} (not a file, directory or symbolic link)")
            return
        host = resolve_in_root(self.root, dest)
        make_parents(self.root, host, self.uid, self.gid)
        clear(host, keep_dir=False)
        if member.issym():
            os.symlink(member.linkname, host)
        else:
            source = context.archive.extractfile(member)
            if source is None:
                raise BuildError(f"COPY: no data for {rel} in the build context")
            with source:
                write_file(host, source, MAX_FILE)
        set_meta(host, self.uid, self.gid, self.mode if self.mode is not None else member.mode, float(member.mtime))


def _mode(step: StepSpec) -> int | None:
    if not step.mode:
        return None
    try:
        return int(step.mode, 8) & 0o7777
    except ValueError as err:
        raise BuildError(f"{step.where}: mode {step.mode!r} is not octal") from err


def copy_step(root: str, contexts_dir: str, step: StepSpec, state: BuildState, log: Log) -> int:
    """Apply a ``COPY`` step onto ``root``; the number of paths written."""
    if len(step.args) < 2:
        raise BuildError(f"{step.where}: COPY needs a source and a destination")
    if not CONTEXT_NAME.fullmatch(step.context):
        raise BuildError(f"{step.where}: context {step.context!r} is not a content hash")
    *sources, dest = step.args
    uid, gid = resolve_owner(root, step.chown) if step.chown else (0, 0)
    placement = Placement(root, uid, gid, _mode(step), log)
    target = posixpath.join(state.workdir or "/", dest)
    blob = os.path.join(contexts_dir, f"{step.context}.tar.gz")
    try:
        archive = tarfile.open(blob, mode="r:gz")
    except (OSError, tarfile.TarError) as err:
        raise BuildError(f"{step.where}: cannot read context {step.context}: {err}") from err
    written = 0
    with archive:
        context = Context.read(archive)
        matched = [path for source in sources for path in context.match(source)]
        into_dir = (
            dest.endswith("/")
            or posixpath.basename(dest) in (".", "")
            or len(matched) > 1
            or os.path.isdir(resolve_in_root(root, target, follow_final=True))
        )
        for rel in matched:
            if context.is_dir(rel):
                placement.place(context, rel, target)
                for child in context.below(rel):
                    placement.place(context, child, posixpath.join(target, child[len(rel) :].lstrip("/")))
                    written += 1
            else:
                file_dest = posixpath.join(target, posixpath.basename(rel)) if into_dir else target
                if into_dir:
                    placement.place(context, "", target)
                placement.place(context, rel, file_dest)
                written += 1
    log(f"{step.where}: copied {written} paths to {target}")
    return written


__all__ = ["Context", "Placement", "copy_step"]
