"""Busybox initramfs (gzip'd newc cpio written in Python: deterministic, no host cpio needed)."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ImageBuildError
from ..util.proc import Progress
from .cache import ContentCache
from .kernel import Kernel

BUSYBOX = Path("/bin/busybox")


@dataclass(frozen=True)
class Initramfs:
    path: Path

    @property
    def image(self) -> Path:
        return self.path / "initrd.img"


class NewcWriter:
    """Minimal writer for the SVR4 "newc" cpio format the kernel unpacks."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        name_b = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name_b), 0]
        self.ino += 1
        self.buf.write(b"070701" + b"".join(b"%08X" % f for f in fields))
        self.buf.write(name_b)
        self._pad()
        self.buf.write(data)
        self._pad()

    def _pad(self) -> None:
        self.buf.write(b"\0" * (-self.buf.tell() % 4))

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def init_script() -> bytes:
    return resources.files("cryobox.image").joinpath("files/initramfs-init").read_bytes()


def build_initramfs(cache: ContentCache, kernel: Kernel, progress: Progress) -> Initramfs:
    if not BUSYBOX.exists():
        raise ImageBuildError(f"{BUSYBOX} is missing: install Debian's busybox-static (make setup does)")
    inputs = {
        "kernel": kernel.path.name,
        "busybox": hashlib.sha256(BUSYBOX.read_bytes()).hexdigest(),
        "init": hashlib.sha256(init_script()).hexdigest(),
    }

    def build(out: Path) -> None:
        progress("building initramfs")
        cpio = NewcWriter()
        for d in ("bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"):
            cpio.directory(d)
        cpio.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
        cpio.file("init", init_script(), 0o755)
        order = kernel.module_order
        cpio.file("lib/modules/order", ("\n".join(order) + "\n").encode())
        for name in order:
            cpio.file(f"lib/modules/{name}.ko", (kernel.modules_dir / f"{name}.ko").read_bytes())
        tmp = out / "initrd.img.tmp"
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as fh:
            fh.write(cpio.finish())
        shutil.move(tmp, out / "initrd.img")

    path, _ = cache.get_or_build("initramfs", inputs, build)
    return Initramfs(path)
