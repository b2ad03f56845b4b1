"""Copying a fetched template's memory home: the bytes, with all-zero blocks left as holes."""

from __future__ import annotations

import os
from pathlib import Path

from cryobox.agent.templates.localize import copy_nonzero


def test_copy_keeps_the_bytes_and_leaves_zero_blocks_as_holes(tmp_path: Path) -> None:
    block = 64 << 10
    src = tmp_path / "src"
    with open(src, "wb") as fh:
        fh.truncate(10 * block + 123)
        fh.seek(2 * block + 7)
        fh.write(os.urandom(1000))
        fh.seek(9 * block)
        fh.write(b"\0" * block)  # data that is all zeros: not copied either
        fh.seek(10 * block)
        fh.write(b"tail")
    dest = tmp_path / "dir" / "memory"
    dest.parent.mkdir()
    written = copy_nonzero(src, dest, block=block)
    assert dest.read_bytes() == src.read_bytes()
    assert written == block + 123  # the block with data and the short last one
    assert dest.stat().st_blocks * 512 <= 2 * block + 8192
    assert oct(dest.stat().st_mode & 0o777) == "0o444"
    assert [p.name for p in dest.parent.iterdir()] == ["memory"]
