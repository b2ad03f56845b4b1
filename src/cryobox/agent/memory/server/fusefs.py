"""The memory server's FUSE filesystem: every memory image in the object store, as one read-only file.

A file's name is its image's store prefix with ``/`` written as ``+``, then ``@`` and the sha256 of its chunk index
as the manifest that named the image pins it (:mod:`cryobox.objstore.pins`)::

    <mount>/templates+base+<generation>@<sha256>   the image indexed by templates/base/<generation>/memory.idx

so the filesystem needs no registration: the first ``getattr`` of a name fetches that image's index (once, however
many callers ask), checks it against the name's sha256 *before* parsing it, and the file's size is the image's size.
The chunk objects need no pins of their own: each is named by, and verified against, its sha256 in the (pinned)
index. An index that does not match, or a name without a pin (an agent older than this server), fails the lookup
with ``EIO`` and an :class:`~cryobox.errors.IntegrityError` (``store_integrity``) recorded as the image's failure;
nothing is kept. An index in the earlier format (one ``memory.pack`` per image) fails it with a ``StoreError``
saying so.
The name is as stable as the manifest it comes from, so a restarted agent finds the files its VMs map.

QEMU maps the file with ``share=off``; every page fault the kernel page cache cannot serve becomes a ``read``
here, which goes to the chunk resolver. A read the resolver cannot serve (the store failed past its retries and
deadline) answers ``EIO``: the faulting QEMU gets ``SIGBUS`` and dies, and the platform reports the recorded
:class:`~cryobox.errors.ChunkFetchFailed` instead of a hung vCPU.

The resolver records the order in which each image's chunks are first read (the prefetch trace of a restore).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mfusepy as fuse

from ....errors import CryoboxError, IntegrityError, ObjectNotFound, StoreError
from ....objstore.chunkfmt import ChunkIndex
from ....objstore.client import ObjectStore
from ....objstore.pins import is_sha256, verify_sha256
from ....util.files import write_atomic
from .chunkref import image_identity
from .failures import FailureLog, boot_clock
from .resolver import ChunkResolver, ImageRef

log = logging.getLogger(__name__)

INDEX_NAME = "memory.idx"
TRACE_NAME = "memory.trace"
INDEX_ATTEMPTS = 4


PIN_MARK = "@"


def file_name(prefix: str, index_sha256: str) -> str:
    """The file name under the mount for the image stored under ``prefix`` whose ``memory.idx`` is pinned to
    ``index_sha256``."""
    if "+" in prefix or PIN_MARK in prefix or not prefix or prefix.startswith("/"):
        raise ValueError(f"invalid image prefix {prefix!r}")
    if not is_sha256(index_sha256):
        raise ValueError(f"invalid chunk index pin {index_sha256!r}")
    return f"{prefix.strip('/').replace('/', '+')}{PIN_MARK}{index_sha256}"


def parse_name(name: str) -> tuple[str, str | None]:
    """The store prefix and the index pin a file name carries (``None``: none, or a malformed one)."""
    base, mark, pin = name.partition(PIN_MARK)
    return base.replace("+", "/"), pin if mark and is_sha256(pin) else None


def prefix_of(name: str) -> str:
    return parse_name(name)[0]


class ImageTable:
    """Image indexes by file name, each loaded from the store at most once at a time (thread-safe).

    Indexes and traces are immutable (their names carry the generation), so a copy is kept under ``local_dir``
    and a restarted server reads them without a GET. An index is kept there only once it matched its pin, and a
    kept copy is checked again when read (one that does not match is removed and fetched afresh).
    """

    def __init__(
        self, store: ObjectStore, local_dir: Path | None = None, stamp: Callable[[], float] = boot_clock
    ) -> None:
        self.store = store
        self.local_dir = local_dir
        self._images: dict[str, ImageRef] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._failures = FailureLog[CryoboxError](stamp)

    def get(self, name: str) -> ImageRef:
        with self._lock:
            found = self._images.get(name)
            if found is not None:
                return found
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:
            with self._lock:
                found = self._images.get(name)
            if found is None:
                try:
                    found = self._load(name)
                except CryoboxError as err:
                    self._failures.record(name, err)
                    raise
                with self._lock:
                    self._images[name] = found
                self._failures.forget(name)
            return found

    def failure(self, name: str, since: float | None = None) -> CryoboxError | None:
        """The error of the last failed attempt to load the image's index, if the latest one failed and it was
        recorded at or after ``since`` (by the ``stamp`` clock)."""
        record = self._failures.latest(name, since)
        return None if record is None else record.error

    def small_object(self, key: str, sha256: str | None = None) -> bytes:
        """An immutable small object (index, trace): the local copy, else the store's (a few retries), kept.
        With ``sha256`` (its pin) both are checked against it, and a store copy that does not match is not kept.

        :raises IntegrityError: the store's copy does not match ``sha256``.
        """
        local = (
            self.local_dir / hashlib.sha256(f"{self.store.url}\0{key}".encode()).hexdigest() if self.local_dir else None
        )
        if local is not None and local.exists():
            kept = local.read_bytes()
            if sha256 is None or hashlib.sha256(kept).hexdigest() == sha256:
                return kept
            log.warning("the kept copy of %s does not match its pin %s: removed, fetching it again", key, sha256)
            local.unlink(missing_ok=True)
        for attempt in range(INDEX_ATTEMPTS):
            try:
                blob = self.store.get(key)
                break
            except ObjectNotFound:
                raise
            except StoreError:
                if attempt == INDEX_ATTEMPTS - 1:
                    raise
                time.sleep(0.1 * 2**attempt)
        if sha256 is not None:
            verify_sha256(key, blob, sha256)
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(local, blob)
        return blob

    def _load(self, name: str) -> ImageRef:
        prefix, pin = parse_name(name)
        if pin is None:
            raise IntegrityError(
                f"memory image {name!r} names no pin of its chunk index (<prefix>{PIN_MARK}<sha256>): refusing to "
                "page it unverified",
                details={"name": name, "key": f"{prefix}/{INDEX_NAME}"},
            )
        key = f"{prefix}/{INDEX_NAME}"
        index = ChunkIndex.from_bytes(self.small_object(key, pin))
        return ImageRef(key=key, index=index, identity=image_identity(self.store.url, key, index.generation))

    def loaded(self) -> dict[str, ImageRef]:
        with self._lock:
            return dict(self._images)


class MemoryFS(fuse.Operations):  # type: ignore[misc]
    """Read-only FUSE operations over :class:`ImageTable` and :class:`ChunkResolver`."""

    use_ns = True

    def __init__(self, table: ImageTable, resolver: ChunkResolver, clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.resolver = resolver
        self._mounted_at_ns = int(clock() * 1e9)
        self.image_gid: int | None = None
        """Files are ``root:image_gid`` 0660 (the mount admits jailed QEMUs, the kernel checks modes); ``None``:
        0644, and only the mounting user (root) may open them."""

    def _ref(self, path: str) -> ImageRef:
        name = path.lstrip("/")
        if not name or "/" in name:
            raise fuse.FuseOSError(errno.ENOENT)
        try:
            return self.table.get(name)
        except ObjectNotFound:
            raise fuse.FuseOSError(errno.ENOENT) from None
        except CryoboxError as err:
            log.error("memory image %s: %s: %s", name, err.code, err)
            raise fuse.FuseOSError(errno.EIO) from None

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        times = {"st_atime": self._mounted_at_ns, "st_mtime": self._mounted_at_ns, "st_ctime": self._mounted_at_ns}
        owner = {"st_uid": 0, "st_gid": self.image_gid or 0, **times}
        if path == "/":
            return {"st_mode": stat.S_IFDIR | (0o755 if self.image_gid is None else 0o750), "st_nlink": 2, **owner}
        ref = self._ref(path)
        size = ref.index.image_size
        # writable mode bits: QEMU < 8.2 opens its RAM file O_RDWR even to map it MAP_PRIVATE (never written back)
        mode = 0o644 if self.image_gid is None else 0o660
        return {"st_mode": stat.S_IFREG | mode, "st_nlink": 1, "st_size": size, "st_blocks": size // 512, **owner}

    def readdir(self, path: str, fh: int) -> list[str]:
        if path != "/":
            raise fuse.FuseOSError(errno.ENOTDIR)
        return [".", "..", *sorted(self.table.loaded())]

    def open(self, path: str, flags: int) -> int:
        self._ref(path)
        if flags & os.O_TRUNC:
            raise fuse.FuseOSError(errno.EROFS)
        return 0

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        raise fuse.FuseOSError(errno.EROFS)  # images are immutable; MAP_PRIVATE copies-on-write in the guest's VM

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        raise fuse.FuseOSError(errno.EROFS)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        ref = self._ref(path)
        try:
            return self.resolver.read(ref, offset, size)  # clamped at the end of the image
        except StoreError as err:
            log.error("read %s @%d+%d failed: %s", path.lstrip("/"), offset, size, err)
            raise fuse.FuseOSError(errno.EIO) from None

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0, "f_namemax": 255}
