"""Bounded VM logs: a guest that writes without end to its serial console (or makes QEMU log) cannot fill the
host's disk.

QEMU appends the console to ``console.log`` (``append=on``: it writes at the end of the file whatever its
size, so the file can be cut under it). :func:`cap` keeps each log at most ``max_bytes``: past that, the last
``keep_bytes`` go to ``<name>.1`` (replacing the previous one) and the log is truncated to nothing. Evidence
and readers see ``<name>.1`` followed by ``<name>`` (:func:`tail_files`). :class:`LogCapper` runs :func:`cap`
over every VM's run directory every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
MAX_BYTES = 4 << 20
KEEP_BYTES = 1 << 20
LOGS = ("console.log", "qemu.log")


def cap(path: Path, max_bytes: int = MAX_BYTES, keep_bytes: int = KEEP_BYTES) -> bool:
    """Rotate ``path`` if it grew past ``max_bytes``; ``True`` if it did."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= max_bytes:
        return False
    with open(path, "rb") as src:
        src.seek(max(0, size - keep_bytes))
        tail = src.read(keep_bytes)
    rotated = path.with_name(path.name + ".1")
    tmp = path.with_name(f".{path.name}.1.tmp")
    tmp.write_bytes(tail)
    os.replace(tmp, rotated)
    os.truncate(path, 0)
    return True


def tail_files(path: Path) -> list[Path]:
    """The files holding what is left of log ``path``, oldest first."""
    return [p for p in (path.with_name(path.name + ".1"), path) if p.exists()]


def cap_all(run_dir: Path, max_bytes: int = MAX_BYTES, keep_bytes: int = KEEP_BYTES) -> int:
    rotated = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(run_dir):
            if entry.is_dir(follow_symlinks=False):
                for name in LOGS:
                    with contextlib.suppress(OSError):
                        rotated += cap(Path(entry.path) / name, max_bytes, keep_bytes)
    return rotated


class LogCapper:
    def __init__(self, run_dirs: list[Path], interval_s: float = 1.0, max_bytes: int = MAX_BYTES) -> None:
        self.run_dirs = run_dirs
        self.interval_s = interval_s
        self.max_bytes = max_bytes
        self.rotations = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="log-capper")

    async def _run(self) -> None:
        while True:
            for run_dir in self.run_dirs:
                try:
                    self.rotations += await asyncio.to_thread(cap_all, run_dir, self.max_bytes)
                except Exception as err:  # keep capping whatever one directory does
                    log.warning("capping logs under %s failed: %s", run_dir, err)
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
