"""Evidence kept beside a snapshot: what the snapshot itself cannot hold.

Every snapshot directory gets ``evidence/`` with the host-side logs of the VM it was taken from (the guest's
serial console and QEMU's own log, copied at capture time). Clients add more (e.g. a failing test's log, by
``cryobox capture``) with ``PUT /v1/snapshots/{id}/evidence/{name}``. Files are written via a temporary name
and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import NotFound, PayloadTooLarge
from ...objstore.keys import check_evidence_name
from ..vm.consolelog import tail_files

DIR = "evidence"
MAX_BYTES = 64 << 20


def collect(snapshot_dir: Path, files: dict[str, Path]) -> None:
    """Copy host files (``{evidence name: path}``) into the snapshot's evidence; missing ones are skipped."""
    target = snapshot_dir / DIR
    target.mkdir(exist_ok=True)
    for name, source in files.items():
        try:
            shutil.copyfile(source, target / check_evidence_name(name))
        except FileNotFoundError:
            continue


def collect_logs(snapshot_dir: Path, logs: dict[str, Path]) -> None:
    """Copy capped VM logs (:mod:`cryobox.agent.vm.consolelog`: the rotated part, then the current one) into
    the snapshot's evidence, streamed and at most ``MAX_BYTES`` each (the newest bytes are kept)."""
    target = snapshot_dir / DIR
    target.mkdir(exist_ok=True)
    for name, source in logs.items():
        parts = tail_files(source)
        if not parts:
            continue
        total = sum(p.stat().st_size for p in parts)
        skip = max(0, total - MAX_BYTES)
        with open(target / check_evidence_name(name), "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    size = part.stat().st_size
                    if skip >= size:
                        skip -= size
                        continue
                    src.seek(skip)
                    skip = 0
                    shutil.copyfileobj(src, out, 1 << 20)


def put(snapshot_dir: Path, name: str, data: bytes) -> int:
    if len(data) > MAX_BYTES:
        raise PayloadTooLarge(f"evidence file of {len(data)} bytes exceeds {MAX_BYTES}")
    target = snapshot_dir / DIR
    target.mkdir(exist_ok=True)
    tmp = target / f".{check_evidence_name(name)}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, target / name)
    return len(data)


def listing(snapshot_dir: Path) -> list[dict[str, object]]:
    target = snapshot_dir / DIR
    if not target.is_dir():
        return []
    return [
        {"name": p.name, "size": p.stat().st_size}
        for p in sorted(target.iterdir())
        if p.is_file() and not p.name.startswith(".")
    ]


def read(snapshot_dir: Path, name: str) -> bytes:
    path = snapshot_dir / DIR / check_evidence_name(name)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"no evidence file {name!r}", details={"name": name}) from None
