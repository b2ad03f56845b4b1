"""qcow2 overlays: making one over a backing image, and reading a backing chain from the headers (what a jail
must bind for QEMU to open a disk)."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from ...errors import VmmError

MAGIC = b"QFI\xfb"
MAX_DEPTH = 32


def create_overlay(path: Path, backing: Path, size_bytes: int | None = None) -> None:
    """A new qcow2 ``path`` over ``backing`` (qcow2 or raw, by its suffix), ``size_bytes`` long if given (else as
    long as the backing image)."""
    fmt = "qcow2" if backing.suffix == ".qcow2" else "raw"
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", fmt, "-b", str(backing), str(path)]
    subprocess.run([*argv, *([str(size_bytes)] if size_bytes is not None else [])], check=True, capture_output=True)


def backing_file(image: Path) -> Path | None:
    """The image's backing file (resolved against the image's directory when relative), or ``None``."""
    with open(image, "rb") as fh:
        header = fh.read(20)
        if len(header) < 20 or header[:4] != MAGIC:
            return None  # a raw image has no backing file
        offset, size = struct.unpack(">QI", header[8:20])
        if offset == 0 or size == 0:
            return None
        if size > 1023:
            raise VmmError(f"qcow2 image {image} names a backing file of {size} bytes")
        fh.seek(offset)
        name = fh.read(size).decode()
    path = Path(name)
    return path if path.is_absolute() else image.parent / path


def backing_chain(image: Path) -> list[Path]:
    """Every file QEMU opens for ``image``'s backing chain (not ``image`` itself), nearest first."""
    chain: list[Path] = []
    current = backing_file(image)
    while current is not None:
        if len(chain) >= MAX_DEPTH or current in chain:
            raise VmmError(f"qcow2 backing chain of {image} is too deep or loops")
        chain.append(current)
        current = backing_file(current)
    return chain
