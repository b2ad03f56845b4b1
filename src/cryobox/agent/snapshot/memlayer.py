"""A snapshot's memory written as a layer over its parent image: only the pages the guest changed cost bytes.

A restored VM maps its parent image (a template generation, a snapshot, a hibernation) ``MAP_PRIVATE``; the
pages it wrote are named by ``/proc/<qemu>/pagemap`` (:mod:`.pagemap`). QEMU's migration stream (the stream
capture) carries every non-zero page, so the capture filters it:

- the snapshot's ``memory`` starts as a **reflink clone** of the parent's file on the snapshot volume (its cost
  does not depend on the size: the extents are shared, copy-on-write);
- a page the guest never wrote is the parent's: skipped (it stays shared);
- a written page whose bytes equal the parent's is skipped too; any other is written over the clone, which
  unshares just that 4 KiB block; a written page that is now zero becomes a hole.

So the snapshot is *flat* for every reader (QEMU maps it like any image; the store uploads it like any image)
while the volume holds only its own pages: the filesystem's extent reference counts are the layer's
reference counts — deleting the parent (or any generation in between) keeps every block a child still uses,
and no chain ever has to be composed at restore (depth is always 1). Where the parent is not on the volume (a
template's image lives in the cache directory), a copy of it is made there once per image and key
(``<volume>/bases/<key>/memory``, :class:`BaseImages`), and every snapshot of that image clones it.

Where there is no parent file (a lazily paged VM whose image is only in the object store, a cold-booted fork)
the whole image is written (:class:`FullImage`).

Every image gets a **content digest**: BLAKE3 over the parent's digest and, in address order, each maximal run
of changed pages within a 4 MiB segment (pages whose bytes differ from the parent's; a page now zero is
changed and hashes as zeros):
its address, its length and the BLAKE3 of its bytes (:func:`chain_digest`; a full image has the empty parent,
so its runs are its non-zero pages). Two captures with the same bytes over the same parent have the same
digest; a child names its parent by that digest, never by a name. Runs, not pages, and BLAKE3, not sha256: a
run hashes in one call that releases the GIL for all of it, so two threads share a long run, and BLAKE3 is the
faster hash here (docs/SPECIFICATION.md).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from blake3 import blake3

from ...errors import VmmError
from ...util.files import data_extents, punch_hole
from ..disk.volume import FICLONE, copy_sparse

if TYPE_CHECKING:  # numpy is imported where pages are compared: a restarting agent does not wait for it
    import numpy as np
    import numpy.typing as npt

PAGE_SIZE = 4096
_ZERO_PAGE = bytes(PAGE_SIZE)
OWN_MARK = b"\1"
"""What a layer records for a page that is its own."""
ZERO_MARK = b"\0" * 32
"""What a layer records, in place of a sha256, for a page that is zero where its parent's is not."""
EMPTY_DIGEST = hashlib.sha256(b"cryobox memory image").hexdigest()


class PageSink(Protocol):
    """Where a migration stream's RAM pages go (see :func:`.vmstream.split_stream`)."""

    def page(self, addr: int, data: memoryview) -> None: ...

    def zero(self, addr: int) -> None: ...

    def refilled(self) -> None: ...


class WrittenTest(Protocol):
    """:class:`.pagemap.WrittenPages`: has the guest written the page at ``offset``?"""

    def written(self, offset: int) -> bool: ...

    def invalidate(self) -> None: ...


@dataclass(frozen=True)
class ParentImage:
    """The image a VM maps, as a file on the snapshot volume that a capture can clone."""

    key: str
    """Its hot key (a template generation's or a snapshot's): provenance only."""
    path: Path
    digest: str


Run = tuple[int, int, bytes]
"""``(address, length, BLAKE3 of its bytes)`` of a run of changed pages."""


def run_hasher() -> blake3:
    """What hashes a run's bytes: BLAKE3 (256 MiB in 43 ms on one thread, 22 on two, where sha256 took 158 and
    75 here; it releases the GIL while it hashes)."""
    return blake3()


SEGMENT = 4 << 20
"""Runs never cross a multiple of this (a 256 MiB run is 64 runs, hashed on as many threads as there are)."""


def segments(addr: int, length: int) -> Iterator[tuple[int, int]]:
    """``[addr, addr + length)`` cut at multiples of :data:`SEGMENT`."""
    end = addr + length
    while addr < end:
        cut = min(end, addr - addr % SEGMENT + SEGMENT)
        yield addr, cut - addr
        addr = cut


def chain_digest(parent: str, runs: Iterable[Run]) -> str:
    """The content digest of an image whose changed runs over the image digested ``parent`` are ``runs``."""
    h = blake3(parent.encode())
    for addr, length, sha in sorted(runs):
        h.update(addr.to_bytes(8, "big") + length.to_bytes(8, "big") + sha)
    return h.hexdigest()


def page_runs(addrs: Iterable[int]) -> list[tuple[int, int]]:
    """``(address, length)`` of the maximal runs of the pages at ``addrs`` (ascending), cut at segments."""
    runs: list[tuple[int, int]] = []
    for addr in addrs:
        if runs and runs[-1][0] + runs[-1][1] == addr and addr % SEGMENT:
            runs[-1] = (runs[-1][0], runs[-1][1] + PAGE_SIZE)
        else:
            runs.append((addr, PAGE_SIZE))
    return runs


def hash_range(fd: int, addr: int, length: int, chunk: int = 4 << 20) -> bytes:
    """The run hash of ``length`` bytes of ``fd`` at ``addr`` (a hole reads as zeros)."""
    h = run_hasher()
    for done in range(0, length, chunk):
        n = min(chunk, length - done)
        data = os.pread(fd, n, addr + done)
        if len(data) != n:
            raise VmmError(f"the image ends before byte {addr + done + n:#x}")
        h.update(data)
    return h.digest()


@dataclass
class _Changes:
    pages: dict[int, bytes] = field(default_factory=dict)
    """address → ``OWN_MARK`` of each page this image has of its own, ``ZERO_MARK`` for a page now zero."""
    runs: list[tuple[int, int, bytes]] = field(default_factory=list)
    """The same, a run at a time (``address, length, mark``: a settle records 65,536 pages of 256 MiB as a few
    runs, where a dict entry each took ~10 ms); never a page that is also in :attr:`pages`."""

    def marks(self) -> dict[int, bytes]:
        """Every changed page's mark."""
        out = dict(self.pages)
        for addr, length, mark in self.runs:
            out.update(dict.fromkeys(range(addr, addr + length, PAGE_SIZE), mark))
        return out

    def own_pages(self) -> int:
        own = sum(1 for mark in self.pages.values() if mark != ZERO_MARK)
        return own + sum(length // PAGE_SIZE for _, length, mark in self.runs if mark != ZERO_MARK)

    def digest(self, parent: str, fd: int) -> str:
        """The digest, reading the changed runs' bytes from ``fd`` (the image)."""
        runs = page_runs(sorted(self.marks()))
        return chain_digest(parent, [(addr, n, hash_range(fd, addr, n)) for addr, n in runs])


class FullImage:
    """Every non-zero page written into ``fd`` (a file already sized to the RAM: zero pages stay holes).

    Nothing is hashed here: a stopped capture's consumer runs inside the pause; :func:`image_digest` names the
    file afterwards."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written: set[int] = set()

    def page(self, addr: int, data: memoryview) -> None:
        os.pwrite(self.fd, data, addr)
        self.written.add(addr)

    def zero(self, addr: int) -> None:
        # (a pre-copy stream may zero a page it sent with data in an earlier round)
        if addr in self.written:
            self.written.discard(addr)
            punch_hole(self.fd, addr, PAGE_SIZE)

    def refilled(self) -> None:
        pass

    @property
    def own_pages(self) -> int:
        return len(self.written)


class LayerImage:
    """Pages the guest wrote, over ``fd`` (a reflink clone of the parent ``parent_fd``); see the module doc."""

    def __init__(self, fd: int, parent_fd: int, written: WrittenTest, parent_digest: str) -> None:
        self.fd = fd
        self.parent_fd = parent_fd
        self.written = written
        self.parent_digest = parent_digest
        self.changes = _Changes()
        self.same_pages = 0
        """Written pages whose bytes equal the parent's (left shared)."""

    def refilled(self) -> None:
        # records read from now on may have been sent after the page map entries cached so far were read
        self.written.invalidate()

    def page(self, addr: int, data: memoryview) -> None:
        # (a pre-copy stream may send a page again: a later copy always lands, even one equal to the parent)
        if not self.written.written(addr):
            return
        if addr not in self.changes.pages and os.pread(self.parent_fd, PAGE_SIZE, addr) == data:
            self.same_pages += 1
            return
        os.pwrite(self.fd, data, addr)
        self.changes.pages[addr] = OWN_MARK

    def zero(self, addr: int) -> None:
        if not self.written.written(addr):
            return
        if addr not in self.changes.pages and os.pread(self.parent_fd, PAGE_SIZE, addr) == _ZERO_PAGE:
            self.same_pages += 1
            return
        punch_hole(self.fd, addr, PAGE_SIZE)
        self.changes.pages[addr] = ZERO_MARK

    @property
    def own_pages(self) -> int:
        """Pages whose bytes are this image's own (a zeroed page is a hole: it costs no block)."""
        return self.changes.own_pages()

    def digest(self) -> str:
        """The layer's content digest (reads its changed runs back from ``fd``: call it before closing that)."""
        return self.changes.digest(self.parent_digest, self.fd)


def image_digest(path: Path, chunk: int = 4 << 20) -> str:
    """The content digest of a whole image file (:func:`chain_digest` over the empty parent: its runs of non-zero
    pages). Holes are never read."""
    import numpy as np

    runs: list[Run] = []
    current: list[Any] = []  # [address, length, hasher] of the run being hashed
    with open(path, "rb") as fh:
        fd = fh.fileno()
        for start, end in data_extents(fd, os.fstat(fd).st_size):
            pos = start - start % PAGE_SIZE
            end += -end % PAGE_SIZE
            while pos < end:
                block = os.pread(fd, min(chunk, end - pos), pos)
                block = block[: len(block) - len(block) % PAGE_SIZE]
                if not block:
                    break
                pages = np.asarray(
                    np.frombuffer(block, dtype=np.uint64).reshape(-1, PAGE_SIZE // 8).any(axis=1), dtype=bool
                )
                for first, last in true_runs(pages):
                    addr = pos + first * PAGE_SIZE
                    piece = memoryview(block)[first * PAGE_SIZE : last * PAGE_SIZE]
                    for at, n in segments(addr, len(piece)):
                        part = piece[at - addr : at - addr + n]
                        if current and current[0] + current[1] == at and at % SEGMENT:
                            current[1] += n
                        else:
                            if current:
                                runs.append((current[0], current[1], current[2].digest()))
                            current = [at, n, run_hasher()]
                        current[2].update(part)
                pos += len(block)
    if current:
        runs.append((current[0], current[1], current[2].digest()))
    return chain_digest(EMPTY_DIGEST, runs)


def true_runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """``[first, last)`` of every run of ``True`` in ``mask``."""
    import numpy as np

    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


class BaseImages:
    """Copies, on the snapshot volume, of parent images that live elsewhere (a template's ``memory`` in the
    cache directory): ``<root>/<key>/memory`` + ``digest``, made once and cloned by every capture of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, asyncio.Lock] = {}

    async def parent(self, key: str, origin: Path, digest: str | None) -> ParentImage:
        """``origin`` (the file a VM maps a copy of) as something a capture on the volume can clone."""
        if _same_fs(origin, self.root.parent) and digest is not None:
            return ParentImage(key, origin, digest)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self._ensure, key, origin, digest)

    def _ensure(self, key: str, origin: Path, digest: str | None) -> ParentImage:
        here = _same_fs(origin, self.root.parent)
        base = self.root / key
        memory = origin if here else base / "memory"
        recorded = base / "digest"
        if recorded.is_file() and (here or memory.is_file()):
            return ParentImage(key, memory, recorded.read_text().strip())
        base.mkdir(parents=True, exist_ok=True)
        if not here:
            copy_sparse(origin, memory)
            memory.chmod(0o444)
        value = digest or image_digest(memory)
        tmp = base / ".digest.tmp"
        tmp.write_text(value + "\n")
        os.replace(tmp, recorded)
        return ParentImage(key, memory, value)

    def prune(self, keep: set[str]) -> list[str]:
        """Remove the copies of images not in ``keep`` (snapshots cloned from one keep their blocks)."""
        if not self.root.is_dir():
            return []
        gone = [entry.name for entry in self.root.iterdir() if entry.name not in keep]
        for name in gone:
            shutil.rmtree(self.root / name, ignore_errors=True)
        return gone


def clone_parent(parent: ParentImage, dest: Path, size: int) -> None:
    """``dest`` = a reflink clone of ``parent.path`` (raises VmmError if it cannot be cloned or is not
    ``size`` bytes: then the capture writes a full image instead)."""
    with open(parent.path, "rb") as src:
        if os.fstat(src.fileno()).st_size != size:
            raise VmmError(f"parent image {parent.path} is not {size} bytes")
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fcntl.ioctl(fd, FICLONE, src.fileno())
        except OSError as err:
            os.close(fd)
            dest.unlink(missing_ok=True)
            raise VmmError(f"cannot clone {parent.path}: {err}") from err
        os.close(fd)


def _same_fs(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


class AllWritten:
    """A :class:`WrittenTest` for pages known to be written (the runs a device-state capture copied)."""

    def written(self, offset: int) -> bool:
        return True

    def invalidate(self) -> None:
        pass


def account_runs(sink: LayerImage, runs: list[tuple[int, int]], chunk: int = 4 << 20) -> tuple[int, int]:
    """Feed the pages of ``runs`` (byte ranges already copied into ``sink.fd``) to ``sink``, so a written page
    that equals its parent stays shared, a zeroed one becomes a hole and the rest are the layer's own pages
    with their digests; returns ``(pages, zero_pages)``. Runs after the pause, while the guest goes on."""
    pages = zeros = 0
    for offset, length in runs:
        done = 0
        while done < length:
            data = os.pread(sink.fd, min(chunk, length - done), offset + done)
            view = memoryview(data)
            for i in range(0, len(data), PAGE_SIZE):
                page = view[i : i + PAGE_SIZE]
                if page == _ZERO_PAGE:
                    sink.zero(offset + done + i)
                    zeros += 1
                else:
                    sink.page(offset + done + i, page)
                    pages += 1
            if not data:
                raise VmmError(f"the layer ends before byte {offset + done:#x}")
            done += len(data)
    return pages, zeros
