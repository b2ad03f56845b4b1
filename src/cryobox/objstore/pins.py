"""Pins: the size and sha256 of every object a publisher uploaded, recorded in the manifest it writes last.

The object store is trusted less than the host, so nothing fetched from it is parsed (by QEMU, ``qemu-img`` or
the chunk index parser) before it matches its pin. A manifest carries them as::

    "pins": {"<store key>": {"size": <bytes>, "sha256": "<hex>"}, ...}

keyed by full store key (the template's own objects and the shared ``images/...`` it names). A chunked image
(``<base>.idx`` + ``<base>.pack``) is pinned by its index alone: the index holds the sha256 of every chunk of the
pack, and every fetch path verifies chunks against it.

Publishing goes through :meth:`PinSet.put_file` / :meth:`PinSet.put` (hash, then upload); fetching through
:meth:`PinSet.fetch_file` (streamed to a temp file while hashed, checked before the rename) and
:meth:`PinSet.fetch_bytes`. A mismatch, a missing pin or a manifest without pins is an :class:`IntegrityError`,
and nothing is left at the destination.

The memory server pages guest RAM from a chunked image it was never handed a manifest for: the agent puts the
sha256 its local manifest pins for the image's index into the file name it opens (``fusefs.file_name``), and the
server checks the index bytes with :func:`verify_sha256` before parsing them.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from .client import ObjectStore

PINS_FIELD = "pins"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Pin:
    """What one stored object must be: exactly ``size`` bytes hashing to ``sha256`` (hex)."""

    size: int
    sha256: str

    @classmethod
    def of_bytes(cls, data: bytes) -> Pin:
        return cls(len(data), hashlib.sha256(data).hexdigest())

    @classmethod
    def of_file(cls, path: Path) -> Pin:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        return cls(size, digest)

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256}

    def check(self, key: str, size: int, sha256: str) -> None:
        """Raise :class:`IntegrityError` unless ``size`` and ``sha256`` are what this pin says ``key`` is."""
        if (size, sha256) != (self.size, self.sha256):
            raise IntegrityError(
                f"object {key!r} from the store does not match its pin: got {size} bytes with sha256 {sha256}, "
                f"expected {self.size} bytes with sha256 {self.sha256}",
                details={"key": key, "size": size, "sha256": sha256, "expected": self.to_json()},
            )


class PinSet:
    """Pins by store key: filled while publishing, or read back from a fetched manifest."""

    def __init__(self, pins: dict[str, Pin] | None = None, what: str = "the manifest") -> None:
        self._pins = dict(pins or {})
        self._what = what

    # -- publishing ---------------------------------------------------------------------------------------------

    def add(self, key: str, pin: Pin) -> None:
        self._pins[key] = pin

    def put_file(self, store: ObjectStore, key: str, path: Path) -> None:
        """Pin the local file ``path`` (immutable while published), then upload it as ``key``."""
        self.add(key, Pin.of_file(path))
        store.put_file(key, path)

    def put(self, store: ObjectStore, key: str, data: bytes) -> None:
        self.add(key, Pin.of_bytes(data))
        store.put(key, data)

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {key: pin.to_json() for key, pin in sorted(self._pins.items())}

    # -- fetching -----------------------------------------------------------------------------------------------

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], what: str) -> PinSet:
        """The pins of a fetched manifest (``what`` names it in errors); none, or malformed ones, are refused."""
        raw = manifest.get(PINS_FIELD)
        if not isinstance(raw, dict) or not raw:
            raise IntegrityError(
                f"{what} pins no object hashes: it cannot be fetched safely (publish it again)",
                details={"manifest": what},
            )
        pins: dict[str, Pin] = {}
        for key, entry in raw.items():
            size = entry.get("size") if isinstance(entry, dict) else None
            sha = entry.get("sha256") if isinstance(entry, dict) else None
            if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
                raise IntegrityError(f"{what} has a malformed pin for {key!r}", details={"key": key})
            if not (isinstance(sha, str) and _SHA256_HEX.fullmatch(sha)):
                raise IntegrityError(f"{what} has a malformed pin for {key!r}", details={"key": key})
            pins[str(key)] = Pin(size, sha)
        return cls(pins, what)

    def pin(self, key: str) -> Pin:
        found = self._pins.get(key)
        if found is None:
            raise IntegrityError(f"{self._what} pins no hash for {key!r}: refusing to fetch it", details={"key": key})
        return found

    def fetch_bytes(self, store: ObjectStore, key: str) -> bytes:
        """A small object, returned only once it matches its pin."""
        pin = self.pin(key)
        data = store.get(key)
        pin.check(key, len(data), hashlib.sha256(data).hexdigest())
        return data

    def fetch_file(self, store: ObjectStore, key: str, dest: Path) -> None:
        """Stream ``key`` to ``dest``, hashed as it arrives; renamed into place only if it matches its pin."""
        pin = self.pin(key)
        store.download(key, dest, lambda size, sha256: pin.check(key, size, sha256))


def is_sha256(value: str) -> bool:
    """Whether ``value`` is a sha256 as pins write it (64 lowercase hex digits)."""
    return _SHA256_HEX.fullmatch(value) is not None


def pinned_sha256(manifest: Mapping[str, Any], key: str) -> str | None:
    """The sha256 ``manifest`` (a local one: fetched, imported, or of a template published from here) pins for
    ``key``, or ``None`` when it pins no well-formed one."""
    pins = manifest.get(PINS_FIELD)
    entry = pins.get(key) if isinstance(pins, dict) else None
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    return sha if isinstance(sha, str) and is_sha256(sha) else None


def verify_sha256(key: str, data: bytes, sha256: str) -> None:
    """Raise :class:`IntegrityError` unless ``data`` (the bytes of ``key``) hashes to ``sha256``."""
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise IntegrityError(
            f"object {key!r} from the store does not match its pin: got {len(data)} bytes with sha256 {got}, "
            f"expected sha256 {sha256}",
            details={"key": key, "size": len(data), "sha256": got, "expected": {"sha256": sha256}},
        )
