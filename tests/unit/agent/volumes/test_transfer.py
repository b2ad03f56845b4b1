"""A volume's image through a real file:// object store: only the chunks the store lacks go up, a fetch rebuilds
the same bytes atomically, and a manifest that is not the pinned one is refused with nothing installed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from cryobox.agent.volumes.transfer import fetch_volume, store_volume
from cryobox.errors import HostUnavailable, IntegrityError, ObjectNotFound
from cryobox.objstore.chunkfmt import CHUNK_SIZE
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.leases import LeaseTiming

VOL = "vol-0123456789ab"
CHUNKS = 10
NOW = LeaseTiming(settle_s=0)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def image(tmp_path: Path) -> Path:
    """A 10-chunk image: every chunk distinct and non-zero."""
    path = tmp_path / "host-a" / f"{VOL}.ext4"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        for i in range(CHUNKS):
            f.write(hashlib.sha256(str(i).encode()).digest() * (CHUNK_SIZE // 32))
    return path


def digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def test_store_uploads_only_changed_chunks_and_fetch_rebuilds_the_image(store: ObjectStore, tmp_path: Path) -> None:
    src = image(tmp_path)
    first = store_volume(store, VOL, src, NOW)
    assert (first.uploaded_bytes, first.chunks_put, first.chunks_reused) == (CHUNKS * CHUNK_SIZE, CHUNKS, 0)
    assert store.exists(f"volumes/{VOL}/manifest.json") and store.exists(f"volumes/{VOL}/image.idx")

    with open(src, "r+b") as f:  # 10 %: one chunk of ten changes
        f.seek(3 * CHUNK_SIZE + 100)
        f.write(b"changed")
    second = store_volume(store, VOL, src, NOW)
    assert (second.uploaded_bytes, second.chunks_put, second.chunks_reused) == (CHUNK_SIZE, 1, CHUNKS - 1)
    assert second.manifest_sha256 != first.manifest_sha256
    unchanged = store_volume(store, VOL, src, NOW)
    assert unchanged.uploaded_bytes == 0

    dest = tmp_path / "host-b" / f"{VOL}.ext4"
    dest.parent.mkdir()
    assert fetch_volume(store, VOL, unchanged.manifest_sha256, dest) == CHUNKS * CHUNK_SIZE
    assert digest(dest) == digest(src)
    assert os.stat(dest).st_blocks * 512 >= CHUNKS * CHUNK_SIZE  # allocated in full, like a new volume
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]  # no temporary left


def test_a_manifest_other_than_the_pinned_one_is_refused_and_nothing_is_installed(
    store: ObjectStore, tmp_path: Path
) -> None:
    src = image(tmp_path)
    stored = store_volume(store, VOL, src, NOW)
    key = f"volumes/{VOL}/manifest.json"
    manifest = json.loads(store.get(key))
    manifest["size_bytes"] += 1  # tampered
    store.put(key, json.dumps(manifest).encode())
    dest = tmp_path / "host-b" / f"{VOL}.ext4"
    dest.parent.mkdir()
    with pytest.raises(IntegrityError, match="not the one the registry pins"):
        fetch_volume(store, VOL, stored.manifest_sha256, dest)
    assert list(dest.parent.iterdir()) == []


def test_an_older_pin_after_a_newer_store_is_refused(store: ObjectStore, tmp_path: Path) -> None:
    """The prefix holds the last stored image: a fetch pinned to an earlier store never gets a mix."""
    src = image(tmp_path)
    old = store_volume(store, VOL, src, NOW)
    store_volume(store, VOL, src, NOW)
    dest = tmp_path / f"{VOL}.ext4"
    with pytest.raises(IntegrityError):
        fetch_volume(store, VOL, old.manifest_sha256, dest)
    assert not dest.exists()


def test_a_tampered_chunk_fails_the_fetch_and_leaves_the_old_image(store: ObjectStore, tmp_path: Path) -> None:
    src = image(tmp_path)
    stored = store_volume(store, VOL, src, NOW)
    chunk = next(k for k in store.list("chunks"))
    store.put(chunk, b"x" * CHUNK_SIZE)
    dest = tmp_path / "host-b" / f"{VOL}.ext4"
    dest.parent.mkdir()
    dest.write_bytes(b"the stale copy")
    with pytest.raises(Exception, match="checksum"):
        fetch_volume(store, VOL, stored.manifest_sha256, dest)
    assert dest.read_bytes() == b"the stale copy"
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]


def test_no_stored_image_and_no_room(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound):
        fetch_volume(store, VOL, "0" * 64, tmp_path / f"{VOL}.ext4")
    stored = store_volume(store, VOL, image(tmp_path), NOW)

    def full(size: int) -> None:
        raise HostUnavailable(f"no room for {size}")

    with pytest.raises(HostUnavailable, match=str(CHUNKS * CHUNK_SIZE)):
        fetch_volume(store, VOL, stored.manifest_sha256, tmp_path / f"{VOL}.ext4", full)
    assert not (tmp_path / f"{VOL}.ext4").exists()
