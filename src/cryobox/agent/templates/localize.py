"""Bringing a fetched template's memory home, so its sandboxes map a local copy again.

A template fetched from the object store has no local ``memory``: its first restores page RAM in through the
memory server. Such a VM cannot be write-protected (userfaultfd-wp needs shmem here) and has no parent file on the
volume, so each of its snapshots is written as a whole image (the pages it never wrote read back through the memory
server) rather than as a layer of what it changed, and it depends on the store. In ``--memory hot`` mode the agent
therefore copies the image, in the background, from the memory server's file (every chunk once, through the same
resolver and cache; zero blocks stay holes) into the template directory; restores spawned after that map the usual
tmpfs copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from ...errors import IntegrityError, VmmError
from ...util.files import fsync_dir
from ..memory.client import MemoryServerProcess, image_name
from .bake import Template

log = logging.getLogger(__name__)

BLOCK = 4 << 20


def copy_nonzero(src: Path, dest: Path, block: int = BLOCK) -> int:
    """Copy ``src`` to ``dest`` leaving all-zero blocks as holes (written atomically); returns bytes written."""
    zero = memoryview(bytes(block))
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}")
    written = 0
    try:
        with open(src, "rb", buffering=0) as fin, open(tmp, "wb") as fout:
            size = os.fstat(fin.fileno()).st_size
            fout.truncate(size)
            buf = memoryview(bytearray(block))
            offset = 0
            while offset < size:
                n = fin.readinto(buf[: min(block, size - offset)])
                if not n:
                    raise VmmError(f"{src}: short read at {offset} of {size}")
                if buf[:n] != zero[:n]:
                    os.pwrite(fout.fileno(), buf[:n], offset)
                    written += n
                offset += n
            os.fsync(fout.fileno())
        tmp.chmod(0o444)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return written


class Localizer:
    """Background copies of fetched templates' memory; :meth:`close` stops waiting for them."""

    def __init__(self, memserver: MemoryServerProcess) -> None:
        self.memserver = memserver
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, templates: Iterable[Template]) -> int:
        """Start copying every template whose memory is only in the store; returns how many."""
        started = 0
        for template in templates:
            prefix = template.manifest.get("memory_prefix")
            if isinstance(prefix, str) and not template.memory.exists():
                try:
                    name = image_name(template.manifest, prefix)  # the memory server checks the index against it
                except IntegrityError as err:
                    log.warning("cannot bring the memory of %s home: %s", template.name, err)
                    continue
                task = asyncio.create_task(self._one(template, name))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                started += 1
        return started

    async def _one(self, template: Template, name: str) -> None:
        began = time.monotonic()
        try:
            written = await asyncio.to_thread(copy_nonzero, self.memserver.path_for(name), template.memory)
        except Exception as err:  # restores keep paging from the store; only snapshots stay slower
            log.warning("could not bring the memory of %s home: %s", template.name, err)
            return
        log.info(
            "memory of template %s is local now (%d MiB in %.1fs): new restores map it from tmpfs",
            template.name,
            written >> 20,
            time.monotonic() - began,
        )

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
