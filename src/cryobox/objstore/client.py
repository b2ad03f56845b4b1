"""The object store: one small, synchronous, thread-safe API over obstore (S3, a local directory, memory).

``open_store(url)`` understands three kinds of URL::

    file:///abs/dir                                        a directory (created if missing)
    s3://bucket[/prefix][?endpoint=http://host:port&region=us-east-1]
    memory://                                              a fresh in-memory store (tests)

Every call that reaches the store goes through one boundary (``_boundary``) that translates obstore's and the
OS's exceptions into cryobox's tree: a missing key (or bucket) is ``ObjectNotFound``, HTTP 503 / 429 ("SlowDown")
is ``StoreThrottled``, anything else is ``StoreError``; the original is kept as ``__cause__``.

Retries: the chunk resolver owns the retry policy of the demand-paging path, so a range GET (``get_range``, which
is also how it GETs a whole chunk object) is sent exactly once. Every other operation keeps a small obstore retry
budget (``OTHER_RETRIES``) because nobody above retries it.

Note: obstore's S3 builder also reads ``AWS_*`` variables from the process environment for anything not set
here explicitly (e.g. ``AWS_ENDPOINT_URL``); ``open_store`` sets region, credentials, endpoint and path style.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable
from urllib.parse import parse_qsl, unquote, urlsplit

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.store import LocalStore, MemoryStore, S3Store

from ..errors import InvalidArgument, ObjectNotFound, StoreError, StoreThrottled
from ..util.files import fsync_dir
from .stats import StoreStats as StoreStats

if TYPE_CHECKING:
    from obstore import ObjectMeta as ObstoreMeta
    from obstore.store import ClientConfig, RetryConfig, S3Config

Backend: TypeAlias = "LocalStore | MemoryStore | S3Store"
Verify: TypeAlias = Callable[[int, str], None]
"""Called by ``download`` with the size and sha256 (hex) of the bytes written, before the file is renamed into
place; raising refuses the object (the temp file is removed, ``dest`` is untouched)."""

MiB = 1 << 20
PART_SIZE = 8 * MiB  # multipart part size for large uploads (S3 needs >= 5 MiB for every part but the last)
PART_CONCURRENCY = 4
DOWNLOAD_CHUNK = 8 * MiB
OTHER_RETRIES = 2  # obstore retries for everything except range GETs
RANGE_TIMEOUT = "10s"  # one range GET (a 4 MiB chunk), connect to last byte: fails well inside a fetch deadline
REQUEST_TIMEOUT = "1h"  # any other request (a whole-object download streams through one request)
THROTTLE_STATUSES = frozenset({429, 503})

_SEGMENT_BAD = {"", ".", ".."}
_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")
_SLOWDOWN = re.compile(r"<Code>(SlowDown|TooManyRequests|RequestLimitExceeded|Throttling)</Code>")
_S3_QUERY = frozenset({"endpoint", "region"})


@dataclass(frozen=True)
class ObjectMeta:
    key: str
    size: int
    etag: str | None
    last_modified: float | None = None  # seconds since the epoch, by the store's clock


@runtime_checkable
class ObjectStore(Protocol):
    """What the platform needs of an object store. Thread-safe; every method may block on the network."""

    @property
    def url(self) -> str: ...  # canonical identity (no credentials), e.g. "s3://bucket?endpoint=http://h:9000"

    @property
    def stats(self) -> StoreStats: ...

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, length: int) -> bytes: ...  # exactly ``length`` bytes

    def head(self, key: str) -> ObjectMeta: ...

    def exists(self, key: str) -> bool: ...

    def probe(self, key: str) -> ObjectMeta | None: ...  # a HEAD whose "no such object" is None, not an error

    def put(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path) -> None: ...

    def download(self, key: str, dest: Path, verify: Verify | None = None) -> None: ...

    def list(self, prefix: str) -> list[str]: ...

    def list_meta(self, prefix: str) -> builtins.list[ObjectMeta]: ...  # like list, with sizes and last-modified times

    def delete(self, key: str) -> None: ...


def check_key(key: str) -> str:
    """A key is ``/``-separated non-empty segments, none of them ``.`` or ``..`` (obstore's path rules)."""
    if not isinstance(key, str) or any(seg in _SEGMENT_BAD for seg in key.split("/")) or "\0" in key:
        raise InvalidArgument(f"invalid object key {key!r}", details={"key": key})
    return key


def response_status(err: BaseException) -> int | None:
    """The HTTP status code an obstore error reports, if any."""
    match = _STATUS.search(str(err))
    return int(match.group(1) or match.group(2)) if match else None


def translate(err: BaseException, op: str, key: str, url: str, *, reading: bool) -> StoreError:
    """obstore / OS exception -> cryobox StoreError subclass (the caller raises it ``from err``)."""
    text = str(err)
    summary = text.split("\n\n", 1)[0].strip() or type(err).__name__
    status = response_status(err)
    details = {"op": op, "key": key, "store": url, "status": status}
    if reading and isinstance(err, FileNotFoundError):
        return ObjectNotFound(f"{op} {key!r}: no such object in {url}", details=details)
    if status in THROTTLE_STATUSES or _SLOWDOWN.search(text):
        return StoreThrottled(f"{op} {key!r}: {url} is throttling (HTTP {status}): {summary}", details=details)
    return StoreError(f"{op} {key!r} on {url} failed: {summary}", details=details)


class ObstoreStore:
    """``ObjectStore`` over an obstore backend. ``ranged`` is the backend used for range GETs (no retries);
    ``local_root`` is the directory of a ``file://`` store, whose new objects are fsynced (obstore does not)."""

    def __init__(
        self, url: str, backend: Backend, ranged: Backend | None = None, local_root: Path | None = None
    ) -> None:
        self.url = url
        self.stats = StoreStats()
        self._backend = backend
        self._ranged = backend if ranged is None else ranged
        self._local_root = local_root

    def __repr__(self) -> str:
        return f"ObstoreStore({self.url!r})"

    @contextmanager
    def _boundary(self, op: str, key: str, *, reading: bool, probing: bool = False) -> Iterator[None]:
        """The one place foreign exceptions become StoreErrors (and are counted; a probe's "no" is no error)."""
        try:
            yield
        except (ObstoreError, OSError, ValueError) as err:
            translated = translate(err, op, key, self.url, reading=reading)
            if not (probing and isinstance(translated, ObjectNotFound)):
                self.stats.failed(translated)
            raise translated from err
        except StoreError as err:
            self.stats.failed(err)
            raise

    def get(self, key: str) -> bytes:
        check_key(key)
        self.stats.add(gets=1)
        with self._boundary("get", key, reading=True):
            data = obstore.get(self._backend, key).bytes().to_bytes()
        self.stats.add(get_bytes=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_key(key)
        if start < 0 or length < 0:
            raise InvalidArgument(f"invalid range start={start} length={length}", details={"key": key})
        if length == 0:
            return b""
        self.stats.add(gets=1)
        with self._boundary("get_range", key, reading=True):
            data = obstore.get_range(self._ranged, key, start=start, length=length).to_bytes()
            if len(data) != length:  # obstore returns the remainder when the range runs past the end
                raise StoreError(
                    f"get_range {key!r} [{start}, +{length}) on {self.url}: short read of {len(data)} bytes",
                    details={"op": "get_range", "key": key, "store": self.url, "status": None, "got": len(data)},
                )
        self.stats.add(get_bytes=len(data))
        return data

    def head(self, key: str) -> ObjectMeta:
        return self._head(key, probing=False)

    def exists(self, key: str) -> bool:
        return self.probe(key) is not None

    def probe(self, key: str) -> ObjectMeta | None:
        try:
            return self._head(key, probing=True)
        except ObjectNotFound:
            return None

    def _head(self, key: str, *, probing: bool) -> ObjectMeta:
        check_key(key)
        with self._boundary("head", key, reading=True, probing=probing):
            meta = obstore.head(self._backend, key)
        return _meta(meta, key)

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        self.stats.add(puts=1)
        with self._boundary("put", key, reading=False):
            obstore.put(self._backend, key, data, chunk_size=PART_SIZE, max_concurrency=PART_CONCURRENCY)
            self._sync_local(key)

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file, streamed; files larger than ``PART_SIZE`` go up as a multipart upload."""
        check_key(key)
        if not path.is_file():
            raise InvalidArgument(f"put_file {key!r}: {path} is not a file", details={"path": str(path)})
        self.stats.add(puts=1)
        with self._boundary("put_file", key, reading=False):
            obstore.put(self._backend, key, path, chunk_size=PART_SIZE, max_concurrency=PART_CONCURRENCY)
            self._sync_local(key)

    def _sync_local(self, key: str) -> None:
        """A file store's put is a rename of a temp file: make the data and the rename durable."""
        if self._local_root is None:
            return
        path = self._local_root / key
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(path.parent)

    def download(self, key: str, dest: Path, verify: Verify | None = None) -> None:
        """Stream an object into ``dest``: write a temp file next to it, fsync, rename, fsync the directory.
        With ``verify`` the bytes are hashed as they arrive and ``verify(size, sha256)`` runs before the rename."""
        check_key(key)
        if not dest.parent.is_dir():
            raise InvalidArgument(f"download {key!r}: {dest.parent} is not a directory", details={"dest": str(dest)})
        self.stats.add(gets=1)
        tmp = dest.with_name(f".{dest.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
        written = 0
        digest = hashlib.sha256() if verify is not None else None
        try:
            with self._boundary("download", key, reading=True):
                result = obstore.get(self._backend, key)
                expected = result.meta["size"]
                with open(tmp, "wb") as fh:
                    for piece in result.stream(min_chunk_size=DOWNLOAD_CHUNK):
                        fh.write(piece)
                        written += len(piece)
                        if digest is not None:
                            digest.update(piece)
                    fh.flush()
                    os.fsync(fh.fileno())
                if written != expected:
                    raise StoreError(f"download {key!r}: got {written} of {expected} bytes", details={"key": key})
                if verify is not None and digest is not None:
                    verify(written, digest.hexdigest())
                os.replace(tmp, dest)
                fsync_dir(dest.parent)
        finally:
            tmp.unlink(missing_ok=True)
        self.stats.add(get_bytes=written)

    def list(self, prefix: str) -> list[str]:
        """Sorted keys under ``prefix``, matched by whole segments ("a/b" lists "a/b/c", not "a/bc")."""
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        with self._boundary("list", prefix, reading=False):
            found = obstore.list(self._backend, prefix or None).collect()
        return sorted(meta["path"] for meta in found)

    def list_meta(self, prefix: str) -> builtins.list[ObjectMeta]:
        """:meth:`list` with every object's size and last-modified time (one listing, no HEAD per object)."""
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        with self._boundary("list", prefix, reading=False):
            found = obstore.list(self._backend, prefix or None).collect()
        return sorted((_meta(meta) for meta in found), key=lambda m: m.key)

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""
        check_key(key)
        with self._boundary("delete", key, reading=False):
            try:
                obstore.delete(self._backend, key)
            except FileNotFoundError:
                pass


def _meta(meta: ObstoreMeta, key: str | None = None) -> ObjectMeta:
    return ObjectMeta(
        key=meta["path"] if key is None else key,
        size=meta["size"],
        etag=meta["e_tag"],
        last_modified=meta["last_modified"].timestamp(),
    )


def _range_retry() -> RetryConfig:
    return {"max_retries": 0, "retry_timeout": timedelta(seconds=30)}


def _other_retry() -> RetryConfig:
    return {
        "max_retries": OTHER_RETRIES,
        "retry_timeout": timedelta(seconds=60),
        "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=2), "base": 2},
    }


def _open_s3(url: str, env: Mapping[str, str]) -> ObstoreStore:
    parts = urlsplit(url)
    bucket = parts.netloc
    if not bucket or "@" in bucket:
        raise InvalidArgument(f"s3 URL needs a bucket and no credentials: {url!r}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(query) - _S3_QUERY
    if unknown:
        raise InvalidArgument(f"unknown s3 URL parameters {sorted(unknown)} in {url!r}")
    prefix = unquote(parts.path).strip("/")
    if prefix:
        check_key(prefix)
    endpoint = query.get("endpoint", "").rstrip("/")
    region = query.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    key_id, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if bool(key_id) != bool(secret):
        raise InvalidArgument("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together")

    config: S3Config = {"region": region, "virtual_hosted_style_request": False}
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise InvalidArgument(f"s3 endpoint must be an http(s) URL: {endpoint!r}")
        config["endpoint"] = endpoint
    if key_id:
        config["access_key_id"] = key_id
        config["secret_access_key"] = secret
        if env.get("AWS_SESSION_TOKEN"):
            config["session_token"] = env["AWS_SESSION_TOKEN"]
    allow_http = endpoint.startswith("http://")
    ranged_client: ClientConfig = {"allow_http": allow_http, "connect_timeout": "5s", "timeout": RANGE_TIMEOUT}
    other_client: ClientConfig = {"allow_http": allow_http, "connect_timeout": "5s", "timeout": REQUEST_TIMEOUT}

    canonical = f"s3://{bucket}" + (f"/{prefix}" if prefix else "") + (f"?endpoint={endpoint}" if endpoint else "")
    with _opening(canonical):
        backend = S3Store(
            bucket, prefix=prefix or None, config=config, client_options=other_client, retry_config=_other_retry()
        )
        ranged = S3Store(
            bucket, prefix=prefix or None, config=config, client_options=ranged_client, retry_config=_range_retry()
        )
    return ObstoreStore(canonical, backend, ranged)


@contextmanager
def _opening(url: str) -> Iterator[None]:
    try:
        yield
    except (ObstoreError, OSError, ValueError) as err:
        raise StoreError(f"cannot open object store {url}: {str(err).split(chr(10))[0]}") from err


def open_store(url: str, env: Mapping[str, str] | None = None) -> ObjectStore:
    """Open the store named by ``url`` (see the module doc). ``env`` (default ``os.environ``) supplies
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``, ``AWS_REGION``) for s3."""
    env = os.environ if env is None else env
    scheme = urlsplit(url).scheme
    if scheme == "s3":
        return _open_s3(url, env)
    if scheme == "memory":
        if url.rstrip("/") != "memory:":
            raise InvalidArgument(f"memory store URL takes no path: {url!r}")
        return ObstoreStore("memory://", MemoryStore())
    if scheme == "file":
        parts = urlsplit(url)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or parts.query or not path.startswith("/"):
            raise InvalidArgument(f"file store URL must be file:///absolute/dir: {url!r}")
        root = Path(os.path.normpath(path))
        canonical = f"file://{root}"
        with _opening(canonical):
            return ObstoreStore(canonical, LocalStore(prefix=root, mkdir=True), local_root=root)
    raise InvalidArgument(f"unsupported object store URL {url!r} (use file://, s3:// or memory://)")
