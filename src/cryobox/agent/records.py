"""Durable sandbox records: what a restarted agent needs to re-adopt a running VM (or a hibernated sandbox).

One JSON file per sandbox under ``<data>/vol/sandboxes/<id>.json``, written atomically (temp file, fsync,
rename, fsync of the directory) whenever the sandbox changes state, and *before* the sandbox is reported ready.
A record names its QEMU by pid **and** the process start time (``/proc/<pid>/stat`` field 22), so a reused pid
is never mistaken for the VM; plus the sockets, the run directory, the disk overlay, the memory mapping and the
network slot. A hibernated sandbox's record has no VM, only the path of its hibernation image.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..util.files import fsync_dir, write_json_atomic

log = logging.getLogger(__name__)
VERSION = 1


def process_start_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot, or ``None`` if it does not exist (or is a zombie)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):  # zombie or dead: gone for our purposes
        return None
    try:
        return int(fields[19])  # field 22 of the whole line; fields here start at field 3
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class VmRecord:
    vm_id: str
    pid: int
    start_ticks: int
    root: str
    """The VM's run directory (its QMP socket, guest-agent socket, logs and pidfile live there)."""
    disk: str
    memory_path: str
    memory_share: bool
    write_trackable: bool
    machine: dict[str, Any]
    netns: str | None = None
    tap: str = "tap0"
    slot_index: int | None = None
    slot_cidr: str | None = None
    uid: int | None = None
    """The jail uid QEMU runs as (``None``: not jailed)."""
    """The slot plan's CIDR when the VM started (a restarted agent must carve the same slots)."""

    def alive(self, proc: Path = Path("/proc")) -> bool:
        """The recorded QEMU still runs (same pid, same start time)."""
        return process_start_ticks(self.pid, proc) == self.start_ticks


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    template: str
    cpus: int
    memory_mib: int
    state: str
    """``running``, ``paused`` or ``hibernated``."""
    created_at: float
    workspace_id: str = "default"
    boot_mode: str = "restore"
    boot_ms: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    persistent: bool = False
    ttl_s: int | None = None
    from_snapshot: str | None = None
    instance_id: str = ""
    egress: list[str] | None = None
    vm: VmRecord | None = None
    hibernation: str | None = None
    """Path of the hibernation image (state ``hibernated``)."""
    mapped_image: str | None = None
    """Hot copy of the hibernation image the VM woke from (it still maps it)."""

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxRecord:
        values = {k: v for k, v in data.items() if k != "version"}
        vm = values.pop("vm", None)
        return cls(**values, vm=VmRecord(**vm) if vm is not None else None)


class SandboxRecords:
    """The records directory. Writes are durable when they return; a corrupt file is set aside, not fatal."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}.json"

    def write(self, record: SandboxRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._path(record.id), record.to_json())

    def remove(self, sandbox_id: str) -> None:
        path = self._path(sandbox_id)
        if path.exists():
            path.unlink(missing_ok=True)
            fsync_dir(self.root)

    def load_all(self) -> list[SandboxRecord]:
        if not self.root.is_dir():
            return []
        records = []
        for path in sorted(self.root.iterdir()):
            if path.name.startswith("."):  # a temp file of a write that never finished
                path.unlink(missing_ok=True)
                continue
            if path.suffix != ".json":
                continue
            try:
                records.append(SandboxRecord.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, TypeError, KeyError) as err:
                log.error("sandbox record %s is unreadable (%s); set aside as %s.bad", path, err, path.name)
                with contextlib.suppress(OSError):
                    os.replace(path, path.with_suffix(".bad"))
        return records
