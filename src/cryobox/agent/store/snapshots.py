"""Snapshots on the host: capture a running VM into a directory, load one back as a restore source.

A snapshot directory ``<volume>/snapshots/<id>/`` has the same shape as a baked template::

    memory        raw guest RAM, sparse (zero pages are holes); restores map it MAP_PRIVATE
    vmstate       device state only (the RAM records were split out into ``memory``)
    disk.qcow2    the root-disk overlay at the same instant (a reflink clone taken inside the pause)
    manifest.json written last; a directory without it is an unfinished capture and is never used

A capture has two phases. :meth:`SnapshotStore.begin` streams the VM's state, splitting it as it arrives
into the hot copy of ``memory`` (tmpfs, see :mod:`.hot`: what restores map) and ``vmstate``, next to the
disk clone; the snapshot can already be restored from (fork_tree starts its children here).
:meth:`SnapshotStore.finish` makes it durable: ``memory`` copied out of tmpfs, every file fsynced, the manifest
written last. A directory without a manifest is unfinished and is removed at start (and on any failure), so a
crash at any step leaves either nothing or a complete snapshot.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import NotFound, VmmError
from ...util.files import fsync_dir, write_json_atomic
from ..vm import MachineConfig, MicroVM
from ..vm.capture import CaptureReport, capture
from . import evidence
from .hot import HotImages
from .layout import ImageFiles
from .vmstream import SplitStats, split_stream
from .volume import allocated_bytes, clone_file, copy_sparse

FORMAT_VERSION = 1
FILES = ("memory", "vmstate", "disk.qcow2")


@dataclass(frozen=True)
class SnapshotImage(ImageFiles):
    """A finished snapshot on this host: something a VM can be restored from."""

    id: str
    path: Path
    machine: MachineConfig
    manifest: dict[str, Any]

    @property
    def hot_key(self) -> str:
        return self.id

    @property
    def template(self) -> str:
        return str(self.manifest["template"])

    @property
    def pause_ms(self) -> float:
        return float(self.manifest["capture"]["pause_ms"])

    @property
    def size_bytes(self) -> int:
        return int(self.manifest["size_bytes"])


@dataclass(frozen=True)
class CaptureInfo:
    """What the caller knows about the snapshot being taken (recorded in the manifest)."""

    template: str
    sandbox_id: str | None
    workspace_id: str
    parent_id: str | None = None
    labels: dict[str, str] | None = None


def _fsync(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


class SnapshotStore:
    def __init__(self, root: Path, hot: HotImages, qemu_version: str) -> None:
        self.root = root
        self.hot = hot
        self.qemu_version = qemu_version

    def sweep_partials(self) -> list[str]:
        """Remove unfinished captures and deletions (a crash mid-way); run at start before any capture."""
        self.root.mkdir(parents=True, exist_ok=True)
        removed = []
        for entry in self.root.iterdir():
            if entry.name.startswith(".") or not (entry / "manifest.json").is_file():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        return removed

    def exists(self, snapshot_id: str) -> bool:
        return (self.root / snapshot_id / "manifest.json").is_file()

    def ids(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "manifest.json").is_file())

    def load(self, snapshot_id: str) -> SnapshotImage:
        path = self.root / snapshot_id
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            raise NotFound(f"snapshot {snapshot_id} has no files on this host", details={"id": snapshot_id}) from None
        return SnapshotImage(snapshot_id, path, MachineConfig.from_json(manifest["machine"]), manifest)

    async def hot_memory(self, image: SnapshotImage) -> Path:
        """The tmpfs copy of the image's memory that restores map (made once per host, shared)."""
        return await self.hot.ensure(image.hot_key, image.memory)

    def delete(self, snapshot_id: str, keep_hot: bool = False) -> None:
        """Remove the snapshot's files (idempotent) and, unless ``keep_hot``, its hot copy. VMs restored from it
        keep their mappings (but a VM whose mapped file is unlinked can no longer be snapshotted)."""
        path = self.root / snapshot_id
        if path.exists():
            tomb = self.root / f".{snapshot_id}.deleting"
            os.replace(path, tomb)
            shutil.rmtree(tomb, ignore_errors=True)
        if not keep_hot:
            self.hot.drop(snapshot_id)

    async def capture(
        self, vm: MicroVM, snapshot_id: str, info: CaptureInfo, *, keep_running: bool = True
    ) -> SnapshotImage:
        """Snapshot ``vm`` into ``<root>/<snapshot_id>`` durably (:meth:`begin` then :meth:`finish`)."""
        return await self.finish(await self.begin(vm, snapshot_id, info, keep_running=keep_running))

    async def begin(
        self, vm: MicroVM, snapshot_id: str, info: CaptureInfo, *, keep_running: bool = True
    ) -> SnapshotImage:
        """Capture ``vm``: restorable on this host when this returns, durable only after :meth:`finish`.
        The VM keeps running (``keep_running``) after a pause covering only its device state and a disk
        clone; otherwise it ends stopped.

        :raises VmmError: the capture failed; nothing is left behind and a running VM is running again.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        work = self.root / snapshot_id
        work.mkdir()
        hot_dir = self.hot.path(snapshot_id).parent
        started = time.monotonic()
        try:
            hot_dir.mkdir(parents=True, exist_ok=True)
            ram_bytes = vm.config.memory_mib << 20

            async def capture_disk() -> None:
                await asyncio.to_thread(clone_file, vm.disk, work / "disk.qcow2")

            report = await capture(
                vm,
                lambda stream: self._split(stream, hot_dir, work, ram_bytes),
                capture_disk,
                keep_running=keep_running,
            )
            logs = {"console.log": vm.paths.console_log, "qemu.log": vm.paths.qemu_log}
            await asyncio.to_thread(evidence.collect_logs, work, logs)
        except BaseException:
            self._discard(snapshot_id)
            raise
        manifest = self._manifest(snapshot_id, vm, info, report, (time.monotonic() - started) * 1000)
        return SnapshotImage(snapshot_id, work, vm.config, manifest)

    async def finish(self, image: SnapshotImage) -> SnapshotImage:
        """Make a captured snapshot durable; the manifest is written last.

        :raises OSError: the files could not be written; the snapshot is removed.
        """
        started = time.monotonic()
        try:
            await asyncio.to_thread(self._persist, self.hot.path(image.id), image.path)
            manifest = dict(image.manifest)
            manifest["size_bytes"] = sum(allocated_bytes(image.path / name) for name in FILES)
            capture_info = dict(manifest["capture"])
            capture_info["total_ms"] = round(capture_info["total_ms"] + (time.monotonic() - started) * 1000, 1)
            manifest["capture"] = capture_info
            write_json_atomic(image.path / "manifest.json", manifest)
            fsync_dir(self.root)
        except BaseException:
            self._discard(image.id)
            raise
        return SnapshotImage(image.id, image.path, image.machine, manifest)

    def _discard(self, snapshot_id: str) -> None:
        shutil.rmtree(self.root / snapshot_id, ignore_errors=True)
        self.hot.drop(snapshot_id)

    @staticmethod
    def _split(stream: BinaryIO, hot_dir: Path, work: Path, ram_bytes: int) -> SplitStats:
        tmp = hot_dir / ".memory.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, ram_bytes)
            with open(work / "vmstate", "wb") as vmstate:
                stats = split_stream(stream, vmstate, fd)
        finally:
            os.close(fd)
        if stats.blocks.get("ram") != ram_bytes:
            raise VmmError(f"snapshot stream RAM block is {stats.blocks.get('ram')} bytes, expected {ram_bytes}")
        os.replace(tmp, hot_dir / "memory")
        return stats

    @staticmethod
    def _persist(hot_memory: Path, work: Path) -> None:
        copy_sparse(hot_memory, work / "memory")
        for name in FILES:
            _fsync(work / name)
            (work / name).chmod(0o444)

    def _manifest(
        self,
        snapshot_id: str,
        vm: MicroVM,
        info: CaptureInfo,
        report: CaptureReport[SplitStats],
        total_ms: float,
    ) -> dict[str, Any]:
        stats = report.result
        return {
            "format": FORMAT_VERSION,
            "id": snapshot_id,
            "parent": info.parent_id,
            "template": info.template,
            "sandbox_id": info.sandbox_id,
            "workspace_id": info.workspace_id,
            "labels": dict(info.labels or {}),
            "machine": vm.config.to_json(),
            "qemu": self.qemu_version,
            "created_at": time.time(),
            "size_bytes": 0,  # counted by finish()
            "memory": {"bytes": vm.config.memory_mib << 20, "pages": stats.pages, "zero_pages": stats.zero_pages},
            "capture": {
                "mode": report.mode,
                "pause_ms": report.pause_ms,
                "migrate_ms": report.total_ms,
                "qemu_downtime_ms": report.qemu_downtime_ms,
                "prepopulate_ms": report.prepopulate_ms,
                "stream_bytes": stats.stream_bytes,
                "total_ms": round(total_ms, 1),
            },
        }
