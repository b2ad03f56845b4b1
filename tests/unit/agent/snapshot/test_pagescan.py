"""``PAGEMAP_SCAN`` names exactly the pages a ``pagemap`` read names as written, on a real private file mapping of
this process: untouched, read and written pages, in runs that span several answers of the ioctl."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.snapshot import pagemap, pagescan
from cryobox.agent.snapshot.pagemap import pagemap_runs, written_runs
from cryobox.agent.snapshot.pagescan import Unsupported, anonymous_runs

PAGE = 4096
PAGES = 8192  # 32 MiB


@pytest.fixture
def mapping() -> Iterator[mmap.mmap]:
    path = Path(f"/dev/shm/cryobox-test-pagescan-{os.getpid()}")
    with open(path, "wb") as fh:
        fh.truncate(PAGES * PAGE)
        fh.write(b"\x01" * (64 * PAGE))
    with open(path, "rb+") as fh:
        m = mmap.mmap(fh.fileno(), PAGES * PAGE, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    path.unlink()
    yield m
    m.close()


def test_the_scan_finds_the_written_pages_a_pagemap_read_finds(mapping: mmap.mmap) -> None:
    m = mapping
    for page in range(0, 4096, 3):  # read: present file pages
        m[page * PAGE]
    written = [*range(10, 20), 21, 23, *range(500, 900), *range(4000, 4100), 8191]
    for page in written:  # written: the process's own copies (some over read pages, some over untouched ones)
        m[page * PAGE + 5] = 0x42
    lo = ctypes.addressof(ctypes.c_char.from_buffer(m))
    hi = lo + PAGES * PAGE
    expected = [(10 * PAGE, 10 * PAGE), (21 * PAGE, PAGE), (23 * PAGE, PAGE)]
    expected += [(500 * PAGE, 400 * PAGE), (4000 * PAGE, 100 * PAGE), (8191 * PAGE, PAGE)]
    try:
        scanned = anonymous_runs(os.getpid(), lo, hi)
    except Unsupported:
        pytest.fail("this kernel (6.7 or later here) has PAGEMAP_SCAN")
    assert scanned == expected == pagemap_runs(os.getpid(), lo, hi)
    # answers of 2 ranges at a time: the walk goes on where each stopped, runs joined across them
    assert anonymous_runs(os.getpid(), lo, hi, regions=2) == expected
    assert anonymous_runs(os.getpid(), lo + 600 * PAGE, lo + 4050 * PAGE) == [(0, 300 * PAGE), (3400 * PAGE, 50 * PAGE)]


def test_written_runs_falls_back_to_reading_the_page_map(mapping: mmap.mmap, monkeypatch: pytest.MonkeyPatch) -> None:
    m = mapping
    for page in (3, 4, 7000):
        m[page * PAGE] = 1
    lo = ctypes.addressof(ctypes.c_char.from_buffer(m))

    def unsupported(pid: int, lo: int, hi: int) -> list[tuple[int, int]]:
        raise Unsupported("no PAGEMAP_SCAN before Linux 6.7")

    monkeypatch.setattr(pagemap, "anonymous_runs", unsupported)
    assert written_runs(os.getpid(), lo, lo + PAGES * PAGE) == [(3 * PAGE, 2 * PAGE), (7000 * PAGE, PAGE)]
    assert pagescan.PAGEMAP_SCAN == 0xC0606610  # _IOWR('f', 16, struct pm_scan_arg) of linux/fs.h


def test_ranges_answered_twice_or_side_by_side_make_one_run_each() -> None:
    # what this host's kernel answered once: the ranges up to the end, then some of them again
    answered = [(0, 2 * PAGE), (2 * PAGE, 3 * PAGE), (10 * PAGE, 11 * PAGE), (99 * PAGE, 100 * PAGE)]
    answered += [(PAGE, 2 * PAGE), (10 * PAGE, 11 * PAGE), (50 * PAGE, 52 * PAGE)]
    assert pagescan._union(answered) == [(0, 3 * PAGE), (10 * PAGE, PAGE), (50 * PAGE, 2 * PAGE), (99 * PAGE, PAGE)]
    assert pagescan._union([]) == []
