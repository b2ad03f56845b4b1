"""Detaching FUSE mounts (the memory server's), including ones whose server died."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path


def is_stale_fuse(mount: Path) -> bool:
    """``mount`` is a FUSE mount whose server is gone (every access fails with ENOTCONN)."""
    try:
        os.stat(mount)
    except OSError as err:
        return err.errno in (errno.ENOTCONN, errno.EIO)
    return False


def unmount(mount: Path) -> None:
    """Lazily detach ``mount`` if something is mounted there (a dead server's leftover). Idempotent."""
    if os.path.ismount(mount) or is_stale_fuse(mount):
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
