"""Helpers for the store GC tests: images put straight into a file:// store, aged by their files' mtimes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from cryobox.agent.publish.templates import upload_image
from cryobox.errors import StoreError
from cryobox.objstore.chunkfmt import CHUNK_SIZE, ChunkIndex, chunk_key
from cryobox.objstore.client import ObjectStore
from cryobox.objstore.gc import GcClock
from cryobox.objstore.leases import LeaseTiming
from cryobox.objstore.pins import PinSet

HOUR = 3600.0
NO_WAIT = LeaseTiming(settle_s=0.0)  # these publishes never wait for a GC (one may have been killed)


def store_root(store: ObjectStore) -> Path:
    return Path(store.url.removeprefix("file://"))


def age(store: ObjectStore, key: str, seconds: float) -> None:
    """Make ``key`` look ``seconds`` old (its file's mtime; a file:// store's last-modified time)."""
    when = time.time() - seconds
    os.utime(store_root(store) / key, (when, when))


def hours_later(hours: float) -> GcClock:
    """A GC running ``hours`` from now: everything in the store is that much older."""
    return GcClock(wall=lambda: time.time() + hours * HOUR)


def put_image(
    store: ObjectStore, work: Path, prefix: str, pages: dict[int, bytes], manifest: dict[str, object] | None
) -> ChunkIndex:
    """An image under ``prefix``: its chunks, ``memory.idx`` and ``vmstate``, and (unless ``None``) a manifest."""
    work.mkdir(parents=True, exist_ok=True)
    src = work / (prefix.replace("/", "_") + ".img")
    with open(src, "wb") as fh:
        fh.truncate((max(pages, default=0) + 1) * CHUNK_SIZE)
        for i, data in pages.items():
            fh.seek(i * CHUNK_SIZE)
            fh.write(data)
    index = upload_image(store, f"{prefix}/memory", src, prefix, PinSet(), timing=NO_WAIT)
    store.put(f"{prefix}/vmstate", b"device state of " + prefix.encode())
    if manifest is not None:
        store.put(f"{prefix}/manifest.json", json.dumps({"layout": 2, **manifest}).encode())
    return index


def put_generation(
    store: ObjectStore, work: Path, generation: str, pages: dict[int, bytes], published_at: float, *, latest: bool
) -> ChunkIndex:
    manifest = {"name": "base", "generation": generation, "published_at": published_at}
    index = put_image(store, work, f"templates/base/{generation}", pages, manifest)
    if latest:
        store.put("templates/base/latest", json.dumps({"generation": generation}).encode())
    return index


def put_orphan(store: ObjectStore, data: bytes) -> str:
    """A chunk object no index names."""
    key = chunk_key(hashlib.sha256(data).hexdigest())
    store.put(key, data)
    return key


def live_problems(store: ObjectStore) -> list[str]:
    """Every chunk a live image's (or a base image's) index names must be there and hash to its name."""
    problems = []
    keys = store.list("")
    indexes = [k.rsplit("/", 1)[0] + "/memory.idx" for k in keys if k.endswith("/manifest.json")]
    indexes += [k for k in keys if k.startswith("images/") and k.endswith(".idx")]
    for key in indexes:
        if key not in keys:
            problems.append(f"{key}: missing")
            continue
        index = ChunkIndex.from_bytes(store.get(key))
        for sha, where in index.digests().items():
            try:
                data = store.get(chunk_key(sha))
            except StoreError as err:
                problems.append(f"{key}: chunk {where[0]} {sha[:12]}: {err}")
                continue
            if not index.verify(where[0], data):
                problems.append(f"{key}: chunk {where[0]} does not verify")
    return problems


def referenced(store: ObjectStore) -> set[str]:
    """The chunk keys live and base indexes name."""
    keys = store.list("")
    found: set[str] = set()
    for key in keys:
        name = "/image.idx" if key.startswith("volumes/") else "/memory.idx"
        idx = key.rsplit("/", 1)[0] + name if key.endswith("/manifest.json") else key
        if (key.endswith("/manifest.json") or (key.startswith("images/") and key.endswith(".idx"))) and idx in keys:
            found |= {chunk_key(sha) for sha in ChunkIndex.from_bytes(store.get(idx)).digests()}
    return found
