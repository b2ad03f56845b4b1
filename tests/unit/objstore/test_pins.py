"""Pins (``objstore/pins.py``) and the verified download of ``ObjectStore.download`` (a file:// store)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cryobox.errors import ERRORS_BY_CODE, IntegrityError, StoreError
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.pins import Pin, PinSet


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def test_integrity_error_is_a_store_error_with_a_stable_code() -> None:
    assert issubclass(IntegrityError, StoreError)
    assert IntegrityError.code == "store_integrity" and ERRORS_BY_CODE["store_integrity"] is IntegrityError
    assert IntegrityError.http_status == 502


def test_pins_recorded_on_upload_survive_the_manifest_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "vmstate"
    src.write_bytes(b"device state" * 1000)
    pins = PinSet()
    pins.put_file(store, "t/vmstate", src)
    pins.put(store, "t/memory.idx", b"index bytes")
    assert pins.to_json() == {
        "t/memory.idx": {"size": 11, "sha256": hashlib.sha256(b"index bytes").hexdigest()},
        "t/vmstate": {"size": 12000, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()},
    }
    fetched = PinSet.from_manifest({"pins": pins.to_json()}, "test manifest")
    assert fetched.pin("t/vmstate") == Pin.of_file(src)
    assert fetched.fetch_bytes(store, "t/memory.idx") == b"index bytes"
    dest = tmp_path / "out" / "vmstate"
    dest.parent.mkdir()
    fetched.fetch_file(store, "t/vmstate", dest)
    assert dest.read_bytes() == src.read_bytes()


def test_a_download_that_does_not_match_its_pin_leaves_the_destination_alone(
    store: ObjectStore, tmp_path: Path
) -> None:
    pins = PinSet()
    pins.put(store, "t/disk.qcow2", b"the published overlay")
    store.put("t/disk.qcow2", b"the published overlaX")  # same size, one byte changed
    out = tmp_path / "out"
    out.mkdir()
    (out / "disk.qcow2").write_bytes(b"old contents")
    with pytest.raises(IntegrityError, match="does not match its pin") as info:
        pins.fetch_file(store, "t/disk.qcow2", out / "disk.qcow2")
    assert info.value.details["key"] == "t/disk.qcow2"
    assert (out / "disk.qcow2").read_bytes() == b"old contents"
    assert [p.name for p in out.iterdir()] == ["disk.qcow2"], "no temp file left behind"
    with pytest.raises(IntegrityError):
        pins.fetch_file(store, "t/disk.qcow2", out / "new")
    assert not (out / "new").exists()


def test_a_short_or_long_object_is_refused_by_size(store: ObjectStore) -> None:
    pins = PinSet()
    pins.put(store, "k", b"abc")
    store.put("k", b"abcd")
    with pytest.raises(IntegrityError, match="got 4 bytes"):
        pins.fetch_bytes(store, "k")


def test_download_hands_the_verifier_the_size_and_sha256_of_what_it_wrote(store: ObjectStore, tmp_path: Path) -> None:
    store.put("k", b"0123456789")
    seen: list[tuple[int, str]] = []
    store.download("k", tmp_path / "k", lambda size, sha: seen.append((size, sha)))
    assert seen == [(10, hashlib.sha256(b"0123456789").hexdigest())]
    assert (tmp_path / "k").read_bytes() == b"0123456789"


@pytest.mark.parametrize(
    "manifest",
    [
        {},
        {"pins": {}},
        {"pins": []},
        {"pins": {"k": {"size": 3}}},
        {"pins": {"k": {"size": -1, "sha256": "0" * 64}}},
        {"pins": {"k": {"size": True, "sha256": "0" * 64}}},
        {"pins": {"k": {"size": 3, "sha256": "XYZ"}}},
        {"pins": {"k": "0" * 64}},
    ],
)
def test_manifests_without_well_formed_pins_are_refused(manifest: dict[str, object]) -> None:
    with pytest.raises(IntegrityError, match="the test manifest"):
        PinSet.from_manifest(manifest, "the test manifest")


def test_an_object_the_manifest_does_not_pin_is_not_fetched(store: ObjectStore, tmp_path: Path) -> None:
    store.put("other", b"x")
    pins = PinSet.from_manifest({"pins": {"k": {"size": 1, "sha256": "0" * 64}}}, "the test manifest")
    gets = store.stats.gets
    with pytest.raises(IntegrityError, match="pins no hash for 'other'"):
        pins.fetch_file(store, "other", tmp_path / "other")
    assert store.stats.gets == gets and not (tmp_path / "other").exists()
