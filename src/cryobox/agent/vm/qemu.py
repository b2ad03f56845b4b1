"""Which QEMU binary runs the VMs, and what it can do, from its version (read once per process: the binary does
not change under a running agent; an upgrade takes an agent restart, and template generations include the
version).

``CRYOBOX_QEMU`` (a path to a ``qemu-system-x86_64``) picks another binary than the system's, e.g. one unpacked
into a private prefix by ``make qemu10`` (``/opt/cryobox/qemu-<version>/usr/bin/qemu-system-x86_64``). Such a
prefix's own firmware (``usr/share/qemu``, ``usr/share/seabios``) is passed with ``-L`` (Debian's QEMU 10 is not
built relocatable: it would otherwise load the system's 7.2 ROMs) and bound into the jail. This module is the only
place the choice is read.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

from ...errors import InvalidArgument

BINARY_NAME = "qemu-system-x86_64"
QEMU_BINARY = BINARY_NAME
"""The system binary (found on ``PATH``), used unless ``CRYOBOX_QEMU`` says otherwise."""
ENV_QEMU = "CRYOBOX_QEMU"
FIRMWARE_DIRS = ("usr/share/qemu", "usr/share/seabios", "usr/lib/ipxe/qemu")
"""A private prefix's firmware directories, relative to the prefix (Debian's ``--firmwarepath``)."""


def is_qemu_argv0(arg: str) -> bool:
    """Whether a process's ``argv[0]`` is a QEMU we may have started (the system binary or a private one: every
    binary :func:`binary` accepts is named ``qemu-system-x86_64*``)."""
    return Path(arg).name.startswith(BINARY_NAME)


def resolve_binary(value: str | None) -> str:
    """The binary named by a ``CRYOBOX_QEMU`` value (empty or ``None``: the system's).

    :raises InvalidArgument: not an executable file named ``qemu-system-x86_64*`` (our process scans recognise
        QEMUs by that name).
    """
    value = (value or "").strip()
    if not value:
        return QEMU_BINARY
    path = Path(value)
    if not path.is_absolute():
        raise InvalidArgument(f"{ENV_QEMU} must be an absolute path, not {value!r}", details={"env": ENV_QEMU})
    if not is_qemu_argv0(value):
        raise InvalidArgument(
            f"{ENV_QEMU}={value!r}: the binary must be named {BINARY_NAME}* (process scans recognise QEMUs by it)",
            details={"env": ENV_QEMU},
        )
    if not path.is_file() or not os.access(path, os.X_OK):
        raise InvalidArgument(f"{ENV_QEMU}={value!r} is not an executable file", details={"env": ENV_QEMU})
    return str(path)


@functools.cache
def binary() -> str:
    """The QEMU every VM of this process runs (``CRYOBOX_QEMU``, else the system's)."""
    return resolve_binary(os.environ.get(ENV_QEMU))


def prefix_of(binary_path: str) -> Path | None:
    """The private prefix a binary was unpacked into (``<prefix>/usr/bin/qemu-system-x86_64``), or ``None`` for
    a binary installed in the system's ``/usr`` (or found on ``PATH``)."""
    path = Path(binary_path)
    if not path.is_absolute() or path.parent.name != "bin" or path.parent.parent.name != "usr":
        return None
    prefix = path.parent.parent.parent
    return None if prefix == Path("/") else prefix


def install_prefix() -> Path | None:
    """:func:`prefix_of` the binary in use: the jail binds it read-only."""
    return prefix_of(binary())


def firmware_args(binary_path: str | None = None) -> list[str]:
    """``-L DIR`` for each firmware directory of a private prefix that exists (nothing for the system binary)."""
    prefix = prefix_of(binary() if binary_path is None else binary_path)
    if prefix is None:
        return []
    args: list[str] = []
    for rel in FIRMWARE_DIRS:
        if (prefix / rel).is_dir():
            args += ["-L", str(prefix / rel)]
    return args


def version_line_of(binary_path: str) -> str:
    """The first line of ``<binary> --version`` (e.g. ``QEMU emulator version 10.0.2 (Debian ...)``)."""
    out = subprocess.run([binary_path, "--version"], capture_output=True, text=True, check=True, timeout=30)
    return str(out.stdout).splitlines()[0].strip()


@functools.cache
def version_line() -> str:
    return version_line_of(binary())


def parse_version(line: str) -> tuple[int, int]:
    found = re.search(r"version (\d+)\.(\d+)", line)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def version() -> tuple[int, int]:
    return parse_version(version_line())


def private_readonly() -> bool:
    """``memory-backend-file,readonly=on,rom=off``: a private (copy-on-write) guest RAM mapping of a file
    QEMU opens read-only (8.2+). Older QEMU opens every RAM file read-write, even ``share=off`` ones."""
    return version() >= (8, 2)


def option_roms_off() -> bool:
    """``microvm,x-option-roms=off``: QEMU 10's microvm firmware (SeaBIOS's ``bios-microvm.bin``) boots a
    ``-kernel`` only through the linuxboot option ROM (measured: no console output at all without it), so it is
    kept off only where it was measured to work (7.2, whose ``bios-microvm.bin`` is qboot)."""
    return version() < (8, 0)


def background_snapshot_resumes() -> bool:
    """Whether a ``background-snapshot`` migration started on a VM we stopped continues the guest once its
    device state is saved (7.2: ``vm_start()``). Since 9.0 (upstream's "preserve suspended runstate" series;
    measured with 10.0) QEMU restores the run state the VM had when the migration started
    (``vm_resume(vm_old_state)``): paused, so the caller must ``cont`` it."""
    return version() < (9, 0)
