"""A chroot a build-driver test can ``RUN`` in: the host's static ``/bin/busybox`` with its applets linked (what
``busybox --install -s`` makes, done from outside: it needs ``/proc`` inside), plus account files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BUSYBOX = "/bin/busybox"


def busybox_root(root: Path) -> Path:
    """``root`` with busybox at ``/bin/busybox``, its applets, ``/etc/passwd`` and ``/etc/group``."""
    if not os.path.exists(BUSYBOX):
        pytest.skip("needs a static /bin/busybox")
    (root / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    listed = subprocess.run([BUSYBOX, "--list-full"], capture_output=True, text=True, check=True).stdout
    for applet in listed.split():
        link = root / applet
        if link.name == "busybox" or os.path.lexists(link):
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\napp:x:1500:1501::/srv/app:/bin/sh\n"
    )
    (etc / "group").write_text("root:x:0:\nuser:x:1000:\napp:x:1501:\nextra:x:1600:app\n")
    for path in ("root", "home/user", "tmp", "usr/sbin"):
        (root / path).mkdir(parents=True, exist_ok=True)
    os.chown(root / "home" / "user", 1000, 1000)
    return root
