"""ObjectStore over obstore's local-directory and in-memory backends; URL parsing; error translation."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from obstore.exceptions import GenericError

from cryobox.errors import InvalidArgument, ObjectNotFound, StoreError, StoreThrottled
from cryobox.objstore.client import PART_SIZE, ObjectMeta, ObjectStore, ObstoreStore, check_key, open_store, translate

MiB = 1 << 20
CREDS = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    url = f"file://{tmp_path}/objects" if request.param == "file" else "memory://"
    yield open_store(url)


def test_put_get_head_exists(store: ObjectStore) -> None:
    store.put("gen1/memory.idx", b"hello world")
    assert store.get("gen1/memory.idx") == b"hello world"
    meta = store.head("gen1/memory.idx")
    assert meta == ObjectMeta(key="gen1/memory.idx", size=11, etag=meta.etag, last_modified=meta.last_modified)
    assert meta.etag and meta.last_modified is not None and abs(meta.last_modified - time.time()) < 60
    assert store.list_meta("gen1") == [meta]
    store.put("gen1/deeper/x", b"x")
    assert [m.key for m in store.list_meta("")] == ["gen1/deeper/x", "gen1/memory.idx"]
    assert store.exists("gen1/memory.idx") and not store.exists("gen1/other")
    assert store.probe("gen1/memory.idx") == meta and store.probe("gen1/other") is None
    assert store.stats.errors == 0, "a probe's 'no such object' is an answer, not an error"
    store.put("gen1/memory.idx", b"replaced")  # overwrite
    assert store.get("gen1/memory.idx") == b"replaced"


def test_get_range_is_exact_or_an_error(store: ObjectStore) -> None:
    data = bytes(range(256)) * 64
    store.put("pack", data)
    assert store.get_range("pack", 0, 10) == data[:10]
    assert store.get_range("pack", 1000, 4000) == data[1000:5000]
    assert store.get_range("pack", len(data) - 1, 1) == data[-1:]
    assert store.get_range("pack", 5, 0) == b""
    with pytest.raises(StoreError, match="short read") as short:  # obstore itself would return the remainder
        store.get_range("pack", len(data) - 4, 10)
    assert type(short.value) is StoreError
    with pytest.raises(StoreError) as beyond:
        store.get_range("pack", len(data), 1)
    assert type(beyond.value) is StoreError and isinstance(beyond.value.__cause__, GenericError)
    with pytest.raises(InvalidArgument):
        store.get_range("pack", -1, 4)


def test_missing_keys_are_object_not_found(store: ObjectStore, tmp_path: Path) -> None:
    for call in (
        lambda: store.get("nope"),
        lambda: store.get_range("nope", 0, 4),
        lambda: store.head("dir/nope"),
        lambda: store.download("nope", tmp_path / "dest"),
    ):
        with pytest.raises(ObjectNotFound) as caught:
            call()
        assert isinstance(caught.value.__cause__, FileNotFoundError)
        assert caught.value.details["key"] in ("nope", "dir/nope")
    assert not (tmp_path / "dest").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == []
    assert store.stats.errors == 4 and store.stats.throttled == 0


def test_list_is_sorted_and_matches_whole_segments(store: ObjectStore) -> None:
    for key in ("b/2", "a/1", "a/sub/3", "ab/4", "c"):
        store.put(key, b"x")
    assert store.list("") == ["a/1", "a/sub/3", "ab/4", "b/2", "c"]
    assert store.list("a") == ["a/1", "a/sub/3"]
    assert store.list("a/") == ["a/1", "a/sub/3"]
    assert store.list("a/sub") == ["a/sub/3"]
    assert store.list("zzz") == []


def test_delete_missing_is_not_an_error(store: ObjectStore) -> None:
    store.put("k", b"v")
    store.delete("k")
    store.delete("k")
    store.delete("never/was")
    assert not store.exists("k") and store.list("") == []


def test_put_file_and_download_large(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(PART_SIZE + 3 * MiB + 17)  # more than one part: the multipart path
    src.write_bytes(data)
    store.put_file("big/memory.pack", src)
    assert store.head("big/memory.pack").size == len(data)
    dest = tmp_path / "out" / "memory.pack"
    dest.parent.mkdir()
    dest.write_bytes(b"old contents")
    store.download("big/memory.pack", dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["memory.pack"]  # no temp files left
    assert store.get_range("big/memory.pack", PART_SIZE - 5, 10) == data[PART_SIZE - 5 : PART_SIZE + 5]
    with pytest.raises(InvalidArgument):
        store.put_file("x", tmp_path / "missing")
    with pytest.raises(InvalidArgument):
        store.download("big/memory.pack", tmp_path / "no-such-dir" / "f")


def test_stats_count_gets_bytes_puts_errors(store: ObjectStore, tmp_path: Path) -> None:
    store.put("a", b"0123456789")
    store.get("a")
    store.get_range("a", 2, 3)
    store.download("a", tmp_path / "a")
    with pytest.raises(ObjectNotFound):
        store.get_range("b", 0, 1)
    store.get_range("a", 0, 0)  # nothing asked, nothing sent
    assert store.stats.snapshot() == {"gets": 4, "get_bytes": 23, "puts": 1, "errors": 1, "throttled": 0}


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/.", "trailing/", "nul\0"])
def test_invalid_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidArgument):
        store.put(key, b"x")
    with pytest.raises(InvalidArgument):
        check_key(key)


def test_concurrent_threads(store: ObjectStore) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(20):
                key = f"t{i}/{j}"
                store.put(key, key.encode() * 10)
                assert store.get_range(key, 0, len(key)) == key.encode()
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.list("")) == 160
    assert store.stats.gets == 160 and store.stats.puts == 160


def test_file_url_is_canonical_and_created(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "objects"
    store = open_store(f"file://{tmp_path}/deep/./objects/")
    assert store.url == f"file://{root}" and root.is_dir()
    store.put("x/y", b"1")
    assert (root / "x" / "y").read_bytes() == b"1"
    assert open_store("memory://").url == "memory://"
    assert isinstance(store, ObjectStore) and isinstance(store, ObstoreStore)


@pytest.mark.parametrize(
    "url",
    [
        "file://relative/dir",
        "file:///abs?x=1",
        "memory://something",
        "gs://bucket",
        "/plain/path",
        "s3://",
        "s3://user:pw@bucket",
        "s3://bucket?endpoint=http://h:1&color=red",
        "s3://bucket?endpoint=ftp://h",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_store(url, env=CREDS)


def test_s3_url_canonical_identity_without_network() -> None:
    store = open_store("s3://bkt?endpoint=http://127.0.0.1:9/&region=eu-west-1", env=CREDS)
    assert store.url == "s3://bkt?endpoint=http://127.0.0.1:9"
    assert open_store("s3://bkt/some/prefix/", env=CREDS).url == "s3://bkt/some/prefix"
    with pytest.raises(InvalidArgument, match="together"):
        open_store("s3://bkt", env={"AWS_ACCESS_KEY_ID": "k"})


def test_s3_unreachable_endpoint_is_a_store_error() -> None:
    store = open_store("s3://bkt?endpoint=http://127.0.0.1:9", env=CREDS)  # discard port: refused at once
    with pytest.raises(StoreError) as caught:
        store.get_range("k", 0, 1)
    assert type(caught.value) is StoreError and caught.value.details["status"] is None
    assert store.stats.errors == 1


def test_translate_http_statuses() -> None:
    def err(status: int, code: str) -> GenericError:
        return GenericError(
            f"Generic S3 error: Error performing GET http://h/b/k in 1ms - Server returned non-2xx status code: "
            f"{status} X: <Error><Code>{code}</Code></Error>\n\nDebug source: ..."
        )

    url = "s3://b"
    assert type(translate(err(503, "SlowDown"), "get", "k", url, reading=True)) is StoreThrottled
    assert type(translate(err(429, "TooManyRequests"), "get", "k", url, reading=True)) is StoreThrottled
    assert type(translate(err(500, "InternalError"), "get", "k", url, reading=True)) is StoreError
    assert type(translate(err(403, "AccessDenied"), "put", "k", url, reading=False)) is StoreError
    missing = FileNotFoundError("Object at location k not found")
    assert type(translate(missing, "get", "k", url, reading=True)) is ObjectNotFound
    assert type(translate(missing, "put", "k", url, reading=False)) is StoreError
    translated = translate(err(503, "SlowDown"), "get_range", "k", url, reading=True)
    assert translated.details == {"op": "get_range", "key": "k", "store": url, "status": 503}
    assert "Debug source" not in translated.message
