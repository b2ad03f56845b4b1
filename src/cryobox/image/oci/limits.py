"""How much of an image a host accepts: layer count, bytes per layer (compressed and unpacked), bytes in all.

A limit is enforced while the bytes stream (a decompression bomb stops at the limit, not after), and the error,
:class:`~cryobox.errors.ImageTooLarge`, names the limit by its field name and value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ...errors import ImageTooLarge, InvalidArgument

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class ImageLimits:
    max_layers: int = 128
    max_layer_compressed_bytes: int = 4 * GiB
    """One layer as it travels (gzip/zstd)."""
    max_layer_bytes: int = 8 * GiB
    """One layer unpacked to a plain tar."""
    max_total_bytes: int = 16 * GiB
    """All layers unpacked, together (also bounds all layers compressed, together)."""
    max_document_bytes: int = 4 * MiB
    """An index, manifest or config (JSON read into memory)."""

    ENV: ClassVar[tuple[tuple[str, str], ...]] = (
        ("max_layers", "CRYOBOX_IMAGE_MAX_LAYERS"),
        ("max_layer_compressed_bytes", "CRYOBOX_IMAGE_MAX_LAYER_COMPRESSED_BYTES"),
        ("max_layer_bytes", "CRYOBOX_IMAGE_MAX_LAYER_BYTES"),
        ("max_total_bytes", "CRYOBOX_IMAGE_MAX_TOTAL_BYTES"),
    )
    """The environment variables :meth:`from_env` reads (a positive integer each; unset keeps the default)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ImageLimits:
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for field_name, var in cls.ENV:
            raw = env.get(var, "").strip()
            if raw:
                if not raw.isdigit() or int(raw) <= 0:
                    raise InvalidArgument(f"{var} must be a positive integer, not {raw!r}")
                values[field_name] = int(raw)
        return cls(**values)

    def limit(self, name: str) -> ByteLimit:
        value = getattr(self, name)
        assert isinstance(value, int)
        return ByteLimit(name, value)

    def check_layer_count(self, count: int) -> None:
        if count > self.max_layers:
            raise ImageTooLarge(
                f"the image has {count} layers: the limit max_layers is {self.max_layers}",
                details={"limit": "max_layers", "max": self.max_layers},
            )


@dataclass(frozen=True)
class ByteLimit:
    """A number of bytes not to exceed, and the name of the limit it comes from (for the error)."""

    name: str
    max: int
    """The limit as configured."""
    used: int = 0
    """What earlier parts of the image took of it already (for a total)."""

    @property
    def allowed(self) -> int:
        return max(0, self.max - self.used)

    def after(self, used: int) -> ByteLimit:
        """This limit once ``used`` more bytes count against it."""
        return ByteLimit(self.name, self.max, self.used + used)

    def check(self, size: int, what: str) -> None:
        if size > self.allowed:
            raise too_large(f"{what} is larger than allowed", self)


def tightest(*limits: ByteLimit) -> ByteLimit:
    """The smallest of several limits that all apply (the one the error will name)."""
    return min(limits, key=lambda limit: limit.allowed)


def too_large(what: str, limit: ByteLimit) -> ImageTooLarge:
    within = f" ({limit.used} of it taken by earlier layers)" if limit.used else ""
    return ImageTooLarge(
        f"{what}: the limit {limit.name} is {limit.max} bytes{within}",
        details={"limit": limit.name, "max": limit.max},
    )


__all__ = ["ByteLimit", "ImageLimits", "tightest", "too_large"]
