"""``procfs.holders``: which processes have a file open, found by device and inode in the real ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cryobox.util.procfs import holders


def test_holders_names_each_process_with_the_file_open_and_no_other(tmp_path: Path) -> None:
    image = tmp_path / "image"
    image.write_bytes(b"x")
    other = tmp_path / "other"
    other.write_bytes(b"y")
    child = subprocess.Popen(
        [sys.executable, "-c", f"import sys; f = open({str(image)!r}); sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while child.pid not in holders(image) and time.monotonic() < deadline:  # until the child has opened it
            time.sleep(0.01)
        assert holders(image) == [child.pid]
        assert holders(other) == []
        fd = os.open(image, os.O_RDONLY)
        try:
            assert holders(image) == sorted([child.pid, os.getpid()])
        finally:
            os.close(fd)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert holders(image) == []
    assert holders(tmp_path / "missing") == []
