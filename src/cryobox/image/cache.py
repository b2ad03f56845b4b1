"""Content-addressed build cache: ``<root>/<kind>/<key>/`` directories that are complete or absent.

A build runs in a temporary sibling directory; only a finished build is renamed into place, so a crash
mid-build leaves nothing that looks complete. A per-key ``flock`` makes concurrent builders of the same key
wait for one another instead of building twice.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..util.files import fsync_dir, stable_hash


class ContentCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, kind: str, inputs: Any) -> Path:
        return self.root / kind / stable_hash(inputs)

    def get_or_build(self, kind: str, inputs: Any, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """Return ``(path, built)``: the cached directory for ``inputs``, building it with ``build(tmpdir)``.

        ``built`` is False when the result came from the cache.
        """
        final = self.path_for(kind, inputs)
        if final.is_dir():
            return final, False
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.parent / f".{final.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if final.is_dir():
                return final, False
            tmp = _fresh(final)
            try:
                build(tmp)
                _finish(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return final, True

    async def aget_or_build(
        self, kind: str, inputs: Any, build: Callable[[Path], Awaitable[None]]
    ) -> tuple[Path, bool]:
        """:meth:`get_or_build` for a build that is a coroutine (one that runs a VM); waits without blocking."""
        final = self.path_for(kind, inputs)
        if final.is_dir():
            return final, False
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.parent / f".{final.name}.lock", "w") as lock:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            if final.is_dir():
                return final, False
            tmp = _fresh(final)
            try:
                await build(tmp)
                _finish(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return final, True


def _fresh(final: Path) -> Path:
    tmp = final.parent / f".{final.name}.building{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _finish(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    fsync_dir(final.parent)
