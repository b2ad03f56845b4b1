"""What the installed QEMU can do, from its version (read once per process: the binary does not change under
a running agent; an upgrade takes an agent restart, and template generations include the version)."""

from __future__ import annotations

import functools
import re
import subprocess

QEMU_BINARY = "qemu-system-x86_64"


@functools.cache
def version_line() -> str:
    out = subprocess.run([QEMU_BINARY, "--version"], capture_output=True, text=True, check=True)
    return str(out.stdout).splitlines()[0].strip()


def version() -> tuple[int, int]:
    found = re.search(r"version (\d+)\.(\d+)", version_line())
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def private_readonly() -> bool:
    """``memory-backend-file,readonly=on,rom=off``: a private (copy-on-write) guest RAM mapping of a file
    QEMU opens read-only (8.2+). Older QEMU opens every RAM file read-write, even ``share=off`` ones."""
    return version() >= (8, 2)


def option_roms_off() -> bool:
    """``microvm,x-option-roms=off``: QEMU 10's qboot no longer boots a ``-kernel`` without its option ROM
    (measured: no console output at all), so it is kept off only where it was measured to work (7.2)."""
    return version() < (8, 0)
