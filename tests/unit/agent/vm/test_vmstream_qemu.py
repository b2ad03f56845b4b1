"""split_stream on real streams of QEMU 7.2.22 (the system's) and 10.0.2 (bookworm-backports, ``make qemu10``).

Each sample (``data/qemu-<version>-<mode>.stream.gz``, ~21 KB) is the migration stream of a 16 MiB microvm
whose RAM is a ``share=off`` mapping of a tmpfs file with four pattern pages (``0x1000``, ``0x5000``,
``0x7ff000``, ``0xfff000``; byte ``0x40 + i``), booted for 0.5 s with no kernel (its firmware writes a few more
pages), then ``stop`` and ``migrate`` with ``x-ignore-shared``: ``stopped`` is a plain migration (RAM, END, device
state, EOF, vmdesc), ``background`` one with ``background-snapshot`` (the buffered device state follows the last
RAM PART section, no END). After the background snapshot 7.2 was running again and 10.0.2 still paused (why
capture.py continues it).
"""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

import pytest

from cryobox.agent.vm.vmstream import PAGE_SIZE, split_stream

DATA = Path(__file__).parent / "data"
RAM = 16 << 20
PATTERN = {0x1000: 0x40, 0x5000: 0x41, 0x7FF000: 0x42, 0xFFF000: 0x43}
FIRMWARE_PAGES = {0x0, 0x7000, 0x9F000, 0xEF000}  # written by the firmware while the VM ran


@pytest.mark.parametrize("version", ["7.2.22", "10.0.2"])
@pytest.mark.parametrize("mode", ["stopped", "background"])
def test_real_stream_splits(version: str, mode: str, tmp_path: Path) -> None:
    stream = gzip.decompress((DATA / f"qemu-{version}-{mode}.stream.gz").read_bytes())
    memory = tmp_path / "memory"
    fd = os.open(memory, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, RAM)
        vmstate = io.BytesIO()
        stats = split_stream(io.BytesIO(stream), vmstate, fd)
        image = os.pread(fd, RAM, 0)
    finally:
        os.close(fd)
    assert stats.blocks["ram"] == RAM
    assert stats.blocks["pc.bios"] == 64 << 10
    assert stats.pages + stats.zero_pages == RAM // PAGE_SIZE
    assert stats.stream_bytes == len(stream)
    for offset, byte in PATTERN.items():
        assert image[offset : offset + PAGE_SIZE] == bytes([byte]) * PAGE_SIZE
    nonzero = {o for o in range(0, RAM, PAGE_SIZE) if image[o : o + PAGE_SIZE] != bytes(PAGE_SIZE)}
    assert nonzero == set(PATTERN) | FIRMWARE_PAGES
    state = vmstate.getvalue()
    assert state.startswith(b"QEVM")
    assert stats.vmstate_bytes == len(state) < len(stream) - stats.pages * PAGE_SIZE + 1
    assert b"cpu" in state and state.rstrip().endswith(b"}")  # device sections and the JSON vmdesc kept
    assert stats.kept_records > 0  # the ROM blocks' pages stay in vmstate
