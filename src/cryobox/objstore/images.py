"""Chunked images in the object store: upload the chunks a store lacks (then the index), or rebuild an image.

An image stored under ``<base>`` is its index ``<base>.idx`` (pinned in the manifest that names it) plus one
object per distinct non-zero chunk, ``chunks/<sha[:2]>/<sha>`` (:mod:`.chunkfmt`), shared with every other image
holding the same bytes. Uploading is durable-then-advertise: every chunk is in the store before the index that
names it, and the index before the manifest (the callers write that last).

Whether the store has a chunk already is one HEAD per distinct chunk (a present object of the right size is
reused; anything else is uploaded), rather than a listing of ``chunks/``: a listing grows with the whole store
and HEADs with the image (and S3 bills a LIST like many GETs), so HEADs it is, a few at a time (figures:
docs/SPECIFICATION.md).

The publisher holds a :class:`~.leases.PublishLease` naming the chunks while it relies on them, so a concurrent
``cryobox gc --store`` keeps them (see :mod:`.leases`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..errors import IntegrityError, ObjectNotFound, StoreError
from ..util.files import fsync_dir
from .chunkfmt import ChunkIndex, chunk_digest, chunk_key, index_format, read_chunk, scan_image
from .client import ObjectStore
from .leases import DEFAULT_TIMING, LeaseTiming, PublishLease
from .pins import Pin, PinSet

WORKERS = 4  # chunk HEADs / PUTs / GETs in flight per image
T = TypeVar("T")


@dataclass(frozen=True)
class Uploaded:
    """What uploading an image's chunks did: chunks put, chunks the store had already, bytes put."""

    put: int
    reused: int
    put_bytes: int


def upload_chunks(
    store: ObjectStore, path: Path, index: ChunkIndex, lease: PublishLease, workers: int = WORKERS
) -> Uploaded:
    """Put every distinct chunk of the local image ``path`` (described by ``index``) the store lacks; each is read
    again and checked against ``index`` before it goes up (the image must not change while published)."""
    digests = index.digests()
    with open(path, "rb") as fh:

        def one(item: tuple[str, list[int]]) -> int:
            sha, where = item
            length = index.chunk_len(where[0])
            found = store.probe(chunk_key(sha))
            if found is not None and found.size == length:
                return 0
            store.put(chunk_key(sha), read_chunk(fh.fileno(), index, where[0]))
            return length

        sizes = _pooled(one, digests.items(), workers, lease.keep_alive)
    put = [size for size in sizes if size]
    return Uploaded(put=len(put), reused=len(sizes) - len(put), put_bytes=sum(put))


def upload_image(
    store: ObjectStore,
    base: str,
    path: Path,
    generation: str,
    pins: PinSet,
    *,
    lease: PublishLease | None = None,
    index: ChunkIndex | None = None,
    timing: LeaseTiming = DEFAULT_TIMING,
) -> ChunkIndex:
    """Upload the sparse raw image ``path`` as ``<base>.idx`` (pinned) after the chunks it names. ``index``: the
    image's, if scanned already; ``lease``: the publish's (one naming ``base``'s prefix and these chunks), else one
    is taken here."""
    index = index if index is not None else scan_image(path, generation)
    if lease is None:
        lease = PublishLease.begin(store, [base.rsplit("/", 1)[0]], index.digests(), timing)
    upload_chunks(store, path, index, lease)
    pins.put(store, f"{base}.idx", index.to_bytes())
    return index


def stored_index_matches(store: ObjectStore, base: str, index: ChunkIndex) -> bool:
    """Whether ``<base>.idx`` in the store is exactly ``index`` (then its chunks are there: they went up first).
    ``False``: there is none, or one in the earlier format (to be replaced).

    :raises IntegrityError: the stored index is a current one that describes other bytes.
    """
    key = f"{base}.idx"
    try:
        stored = store.get(key)
    except ObjectNotFound:
        return False
    if index_format(stored) == 1:
        return False
    if stored != index.to_bytes():
        raise IntegrityError(
            f"the stored chunk index {key!r} does not describe the local image: refusing to pin it",
            details={"key": key},
        )
    return True


def pin_index(pins: PinSet, base: str, index: ChunkIndex) -> None:
    pins.add(f"{base}.idx", Pin.of_bytes(index.to_bytes()))


def download_image(store: ObjectStore, base: str, dest: Path, pins: PinSet, workers: int = WORKERS) -> ChunkIndex:
    """Rebuild the sparse image stored as ``<base>.idx`` + its chunks at ``dest``: the index must match its pin
    before it is parsed, and every chunk its sha256 in the index. Atomic: nothing is left on failure."""
    index = ChunkIndex.from_bytes(pins.fetch_bytes(store, f"{base}.idx"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}")
    try:
        with open(tmp, "wb") as fout:
            fout.truncate(index.image_size)
            fd = fout.fileno()

            def one(item: tuple[str, list[int]]) -> int:
                sha, where = item
                data = store.get(chunk_key(sha))
                if len(data) != index.chunk_len(where[0]) or chunk_digest(data) != sha:
                    raise StoreError(
                        f"chunk {where[0]} of {base!r} ({chunk_key(sha)}) does not match its checksum (sha256)",
                        details={"key": chunk_key(sha), "image": base},
                    )
                for i in where:
                    os.pwrite(fd, data, i * index.chunk_size)
                return len(data)

            _pooled(one, index.digests().items(), workers)
            os.fsync(fd)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except OSError as err:
        raise StoreError(f"cannot rebuild {base!r} into {dest}: {err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return index


def _pooled(
    fn: Callable[[tuple[str, list[int]]], T],
    items: Iterable[tuple[str, list[int]]],
    workers: int,
    between: Callable[[], None] | None = None,
) -> list[T]:
    """``fn`` over ``items`` on ``workers`` threads; the first error is raised once every started call is done.
    ``between`` runs on the calling thread as results come in (a lease's keep-alive)."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chunks") as pool:
        futures = [pool.submit(fn, item) for item in items]
        results: list[T] = []
        try:
            for future in futures:
                results.append(future.result())
                if between is not None:
                    between()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return results
