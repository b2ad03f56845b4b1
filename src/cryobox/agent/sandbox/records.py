"""Durable sandbox records: what a restarted agent needs to re-adopt a running VM (or a hibernated sandbox).

One JSON file per sandbox under ``<data>/vol/sandboxes/<id>.json``, written atomically (temp file, fsync,
rename, fsync of the directory) whenever the sandbox changes state, and *before* the sandbox is reported ready.
A record names its QEMU by pid **and** the process start time (``/proc/<pid>/stat`` field 22), so a reused pid
is never mistaken for the VM; plus the sockets, the run directory, the disk overlay, the memory mapping and the
network slot. A hibernated sandbox's record has no VM, only the path of its hibernation image.

A record's ``env`` is sealed on disk (:mod:`cryobox.util.sealing`: a token instead of the mapping) with
``CRYOBOX_SECRET_KEY`` if set, else the key file ``secrets/records.key`` beside the records directory (in the
data volume, so it shares the records' fate), created on first use. A record an older version wrote with a plain
``env`` still loads and is re-sealed by :meth:`SandboxRecords.load_all`. A record no key opens stops the load
with :class:`~cryobox.errors.SecretUnreadable` rather than being set aside: a wrong key must not cost sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...util.files import fsync_dir, write_json_atomic
from ...util.procfs import process_start_ticks
from ...util.sealing import Sealer

log = logging.getLogger(__name__)
VERSION = 1
KEY_FILE = Path("secrets") / "records.key"
"""The records' key file, relative to the parent of the records directory (``<data>/vol``)."""


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
    memory_origin: str | None = None
    """The durable file the VM's RAM image is a copy of (``MemoryBacking.origin``)."""
    slot_rules: str | None = None
    """The digest of the nft rules its slot holds (:func:`..net.netlink.slot_rules_digest`): an adopting agent
    reloads them only when its own differ (an upgrade that changed them; ``None``: a record from before)."""

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
    egress: dict[str, Any] | list[str] | None = None
    """The network policy (``EgressPolicy`` as JSON; a list of CIDRs in records of before policies)."""
    vm: VmRecord | None = None
    hibernation: str | None = None
    """Path of the hibernation image (state ``hibernated``)."""
    mapped_image: str | None = None
    """Hot copy of the hibernation image the VM woke from (it still maps it)."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """The attached volumes (``AttachedVolume.to_json``)."""

    def to_json(self, sealer: Sealer) -> dict[str, Any]:
        """The record as stored: its env sealed; no ``volumes`` key without volumes (as records were before)."""
        data = {"version": VERSION, **asdict(self), "env": sealer.seal(self.env)}
        if not self.volumes:
            del data["volumes"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], sealer: Sealer) -> SandboxRecord:
        """A stored record (its env sealed, or a plain mapping from an older version).

        :raises SecretUnreadable: its env cannot be opened.
        """
        values = {k: v for k, v in data.items() if k != "version"}
        vm = values.pop("vm", None)
        values["env"] = sealer.open_stored(values.get("env", {}), what=f"the env of sandbox record {values.get('id')}")
        return cls(**values, vm=VmRecord(**vm) if vm is not None else None)


class SandboxRecords:
    """The records directory. Writes are durable when they return; a corrupt file is set aside, not fatal.

    ``sealer`` seals the records' env (default: ``CRYOBOX_SECRET_KEY``, else the key file :data:`KEY_FILE` beside
    ``root``, read or created at first use).
    """

    def __init__(self, root: Path, sealer: Sealer | None = None) -> None:
        self.root = root
        self.sealer = sealer if sealer is not None else Sealer.load(root.parent / KEY_FILE)

    def _path(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}.json"

    def write(self, record: SandboxRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._path(record.id), record.to_json(self.sealer))

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
                data = json.loads(path.read_text())
                record = SandboxRecord.from_json(data, self.sealer)  # SecretUnreadable propagates: stop
            except (OSError, ValueError, TypeError, KeyError) as err:
                log.error("sandbox record %s is unreadable (%s); set aside as %s.bad", path, err, path.name)
                with contextlib.suppress(OSError):
                    os.replace(path, path.with_suffix(".bad"))
                continue
            if not isinstance(data.get("env"), str):  # written before sealing existed: seal it now
                try:
                    self.write(record)
                    log.info("sealed the plaintext env of sandbox record %s", path)
                except OSError as err:  # still readable: sealed by its next write
                    log.warning("could not seal the plaintext env of sandbox record %s: %s", path, err)
            records.append(record)
        return records
