"""Small real qcow2 step layers for the step cache's tests: a raw base, layers written with ``qemu-io``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryobox.agent.disk.qcow2 import create_overlay
from cryobox.agent.templates.layercache import LayerCache


def make_base(tmp: Path, name: str = "base.raw", fill: int = 0) -> Path:
    """A 1 MiB raw image (its first 4 KiB filled with ``fill`` when non-zero)."""
    base = tmp / name
    with open(base, "wb") as fh:
        fh.truncate(1 << 20)
        if fill:
            fh.write(bytes([fill]) * 4096)
    return base


def write(layer: Path, offset: int, data: bytes) -> None:
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", f"write -P {data[0]} {offset} {len(data)}", str(layer)],
        check=True,
        capture_output=True,
    )


def cut(cache: LayerCache, key: str, parent: Path, offset: int, byte: int, work: Path) -> Path:
    """A layer over ``parent`` holding 512 bytes of ``byte`` at ``offset``, stored in ``cache`` as ``key``."""
    work.mkdir(parents=True, exist_ok=True)
    session = work / f"{key}.qcow2"
    create_overlay(session, parent, 8 << 20 if parent.suffix != ".qcow2" else None)
    write(session, offset, bytes([byte]) * 512)
    stored = cache.store(key, session, parent)
    session.unlink()
    assert stored is not None
    return stored


def flatten(top: Path, out: Path) -> bytes:
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(top), str(out)], check=True, capture_output=True)
    return out.read_bytes()
