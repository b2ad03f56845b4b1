"""The writes of a settle: long runs with ``O_DIRECT``, short ones buffered, never a buffered write or a punch
while a long run's write is in flight (XFS would serialise them), and the short ones made durable."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cryobox.agent.snapshot import layerwrite
from cryobox.agent.snapshot.layerwrite import Holes, LayerWriter, Runs, pieces, runs_reach

PAGE = 4096


class Recorder(LayerWriter):
    """A writer that logs when each write starts and ends (long ones take a while) and each fdatasync."""

    def __init__(self, path: Path, fd: int, staged: memoryview, pool: ThreadPoolExecutor) -> None:
        super().__init__(path, fd, staged, pool)
        self.log: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.overlaps = 0
        """Short writes or punches that ran while a long write was in flight."""

    def _note(self, what: str, edge: str, offset: int) -> None:
        with self.lock:
            self.log.append((what, edge, offset))

    def _write_piece(self, piece: tuple[int, int, int]) -> bool:
        with self.lock:
            self.in_flight += 1
        self._note("long", "start", piece[0])
        time.sleep(0.02)
        done = super()._write_piece(piece)
        self._note("long", "end", piece[0])
        with self.lock:
            self.in_flight -= 1
        return done

    def _write_short(self, runs: Runs, holes: Holes) -> None:
        with self.lock:
            self.overlaps += self.in_flight > 0 and bool(runs or holes)
        for offset, _, _ in runs:
            self._note("short", "write", offset)
        for offset, _ in holes:
            self._note("hole", "punch", offset)
        super()._write_short(runs, holes)


@pytest.fixture
def layer(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "layer"
    with open(path, "wb") as fh:
        fh.truncate(64 * PAGE)
        fh.write(b"\x01" * 64 * PAGE)  # a parent's bytes everywhere
    fd = os.open(path, os.O_RDWR)
    return path, fd


def test_short_runs_and_holes_never_run_beside_a_long_write(
    layer: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, fd = layer
    monkeypatch.setattr(layerwrite, "DIRECT_MIN", 4 * PAGE)
    monkeypatch.setattr(layerwrite, "WRITE_PIECE", 4 * PAGE)
    staged = bytearray(b"".join(bytes([n + 2]) * PAGE for n in range(64)))  # buffer page n holds byte n + 2
    synced: list[float] = []
    real_sync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(time.monotonic())
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with memoryview(staged) as view, ThreadPoolExecutor(4) as pool:
        writer = Recorder(path, fd, view, pool)
        try:
            writer.add([(0, 0, PAGE)], [(2 * PAGE, PAGE)])  # before any long run: written at once
            writer.add([(8 * PAGE, 8 * PAGE, 8 * PAGE), (20 * PAGE, 20 * PAGE, PAGE)], [])  # long: 2 pieces
            writer.add([(24 * PAGE, 24 * PAGE, PAGE)], [(30 * PAGE, 2 * PAGE)])  # after it: held back
            writer.finish()
        finally:
            writer.close()
    os.close(fd)
    log = writer.log
    assert writer.overlaps == 0
    late = [log.index(("short", "write", 20 * PAGE)), log.index(("short", "write", 24 * PAGE))]
    late.append(log.index(("hole", "punch", 30 * PAGE)))
    last_long_end = max(i for i, entry in enumerate(log) if entry[:2] == ("long", "end"))
    first_long = min(i for i, entry in enumerate(log) if entry[0] == "long")
    assert min(late) > last_long_end  # held back until every long write was done
    assert log.index(("short", "write", 0)) < first_long
    assert len(synced) == 2  # the early short run beside the long ones, the late ones at the end
    data = path.read_bytes()
    expect = bytearray(b"\x01" * 64 * PAGE)
    for first, count in ((0, 1), (8, 8), (20, 1), (24, 1)):
        expect[first * PAGE : (first + count) * PAGE] = staged[first * PAGE : (first + count) * PAGE]
    for first, count in ((2, 1), (30, 2)):
        expect[first * PAGE : (first + count) * PAGE] = bytes(count * PAGE)
    assert data == bytes(expect)


def test_runs_reach_and_pieces() -> None:
    # (offset, buffer position, length): end to end in both makes one run
    assert runs_reach([(0, 0, 2 * PAGE), (2 * PAGE, 2 * PAGE, 2 * PAGE)], 4 * PAGE)
    assert not runs_reach([(0, 0, 2 * PAGE), (2 * PAGE, 8 * PAGE, 2 * PAGE)], 4 * PAGE)  # apart in the buffer
    assert not runs_reach([(0, 0, 2 * PAGE), (4 * PAGE, 2 * PAGE, 2 * PAGE)], 4 * PAGE)  # apart in the image
    assert pieces([(0, 8, 10 << 20)]) == [
        (0, 8, 4 << 20),
        (4 << 20, 8 + (4 << 20), 4 << 20),
        (8 << 20, 8 + (8 << 20), 2 << 20),
    ]
