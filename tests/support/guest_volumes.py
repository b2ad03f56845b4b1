"""A guest's view of volume slots without a kernel: a ``/sys/block`` tree under a tmp dir (``vda`` the root disk,
``vdb`` a read-write slot holding an 8192-sector volume, ``vdc`` a read-only slot holding 4096 sectors, ``vdd`` an
empty read-write slot) and a :class:`~cryobox.guest.ops_volumes.VolumeSystem` whose mount, unmount, freeze, claim
and sync only call back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cryobox.guest.ops_volumes import VolumeSystem

DISKS = {
    "vda": {"serial": "", "size": "2519040", "ro": "0"},
    "vdb": {"serial": "cbx-vol-rw0", "size": "8192", "ro": "0"},
    "vdc": {"serial": "cbx-vol-ro0", "size": "4096", "ro": "1"},
    "vdd": {"serial": "cbx-vol-rw1", "size": "0", "ro": "0"},
}


def write_sys_block(root: Path, disks: dict[str, dict[str, str]] | None = None) -> Path:
    for name, attributes in (disks or DISKS).items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for attribute, value in attributes.items():
            (root / name / attribute).write_text(value + "\n")
    return root


def fake_volumes(
    tmp_path: Path,
    on_mount: Callable[[str, str, str, int, str | None], None],
    on_other: Callable[[str, str], None] = lambda op, path: None,
) -> VolumeSystem:
    return VolumeSystem(
        sys_block=str(write_sys_block(tmp_path / "sys" / "block")),
        dev_dir=str(tmp_path / "dev"),
        mount=on_mount,
        umount=lambda path: on_other("umount", path),
        freeze=lambda path: on_other("freeze", path),
        claim=lambda device: on_other("claim", device),
        sync=lambda: on_other("sync", ""),
        capacity_timeout=0.05,
        sleep=lambda seconds: None,
        yield_cpu=lambda: None,
    )
