"""Snapshots on the host: capture a running VM into a directory, load one back as a restore source.

A snapshot directory ``<volume>/snapshots/<id>/`` has the same shape as a baked template::

    memory        raw guest RAM, sparse (zero pages are holes); restores map it MAP_PRIVATE. Written as a layer
                  over the parent image (:mod:`.memlayer`): a reflink clone of the parent's file with only the
                  pages the guest changed written over it, so it holds on the volume just those pages
    vmstate       device state only (the RAM records were split out of the stream)
    disk.qcow2    the root-disk overlay at the same instant (a reflink clone taken inside the pause)
    manifest.json written last; a directory without it is an unfinished capture and is never used

A capture has two phases. :meth:`SnapshotStore.begin` streams the VM's state, splitting it as it arrives
into ``memory`` (on the volume, never on tmpfs: a restore copies it into the hot directory when it first
needs it) and ``vmstate``, next to the disk clone; the snapshot can already be restored from (fork_tree starts
its children here). :meth:`SnapshotStore.finish` makes it durable: every file fsynced, the manifest written
last. A directory without a manifest is unfinished and is removed at start (and on any failure), so a crash
at any step leaves either nothing or a complete snapshot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import NotFound, VmmError
from ...util.files import fsync_dir, write_json_atomic
from ..disk.volume import allocated_bytes, clone_file
from ..memory.hot import HotImages
from ..vm import MachineConfig, MicroVM
from ..vm.migration import CaptureReport, capture, ram_mapping
from ..vm.vmstream import split_stream
from . import evidence
from .layout import ImageFiles
from .memlayer import BaseImages, FullImage, LayerImage, ParentImage, clone_parent, image_digest
from .pagemap import WrittenPages
from .shortpause import Split as _Split
from .shortpause import capture_layer, capture_whole, saves_written
from .staging import StagingPool

FORMAT_VERSION = 1
FILES = ("memory", "vmstate", "disk.qcow2")
PAGE_SIZE = 4096
log = logging.getLogger(__name__)


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

    @property
    def unique_bytes(self) -> int:
        """Bytes only this snapshot holds: the memory pages it changed from its parent image, its device state
        and its disk overlay (manifests older than layering count everything as unique)."""
        return int(self.manifest.get("unique_bytes", self.manifest["size_bytes"]))

    @property
    def shared_bytes(self) -> int:
        """Memory bytes it shares with its parent image (a template generation or another snapshot)."""
        return int(self.manifest.get("shared_bytes", 0))


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


def _readable_private(vm: MicroVM) -> bool:
    """A private mapping of a file we can still read (the memory server's, or a local one without a copy to
    clone): the pages the guest never wrote can be read from it after the pause."""
    return not vm.memory.share and vm.memory.path.is_file()


class SnapshotStore:
    def __init__(
        self,
        root: Path,
        hot: HotImages,
        qemu_version: str,
        bases: BaseImages | None = None,
        staging: StagingPool | None = None,
    ) -> None:
        self.root = root
        self.hot = hot
        self.qemu_version = qemu_version
        self.bases = bases if bases is not None else BaseImages(root.parent / "bases")
        self.staging = staging if staging is not None else StagingPool()
        """Warm buffers for the short-pause capture (:mod:`.staging`)."""

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
        started = time.monotonic()
        written: WrittenPages | None = None
        try:
            ram_bytes = vm.config.memory_mib << 20
            parent = await self._parent(vm)
            if parent is not None and vm.pid is not None:
                lo, hi = ram_mapping(vm.pid, vm.memory.path)
                written = WrittenPages(vm.pid, lo, hi)
            pages = written

            async def capture_disk() -> None:
                await asyncio.to_thread(clone_file, vm.disk, work / "disk.qcow2")

            async with self.hot.capturing(self.hot.key_of(vm.memory.path)):
                report = None
                if keep_running and (parent is not None or _readable_private(vm)) and await saves_written(vm):
                    if parent is not None:
                        report = await capture_layer(vm, work, ram_bytes, parent, capture_disk, self.staging)
                    else:  # lazily paged: its parent is only behind its mapping
                        report = await capture_whole(vm, work, ram_bytes, capture_disk, self.staging)
                if report is None:
                    report = await capture(
                        vm,
                        lambda stream: self._split(stream, work, ram_bytes, parent, pages),
                        capture_disk,
                        keep_running=keep_running,
                    )
            logs = {"console.log": vm.paths.console_log, "qemu.log": vm.paths.qemu_log}
            await asyncio.to_thread(evidence.collect_logs, work, logs)
        except BaseException:
            self._discard(snapshot_id)
            raise
        finally:
            if written is not None:
                written.close()
        manifest = self._manifest(snapshot_id, vm, info, report, (time.monotonic() - started) * 1000)
        return SnapshotImage(snapshot_id, work, vm.config, manifest)

    async def _parent(self, vm: MicroVM) -> ParentImage | None:
        """The image ``vm`` maps a copy of, as a file on the volume to clone (``None``: write a full image)."""
        origin = vm.memory.origin
        if origin is None or vm.memory.share or not origin.is_file():
            return None
        key = self.hot.key_of(vm.memory.path) or origin.parent.name
        try:
            return await self.bases.parent(key, origin, _recorded_digest(origin.parent))
        except OSError as err:
            log.warning("snapshot of %s written whole: no copy of its parent %s on the volume: %s", vm.vm_id, key, err)
            return None

    async def finish(self, image: SnapshotImage) -> SnapshotImage:
        """Make a captured snapshot durable; the manifest is written last.

        :raises OSError: the files could not be written; the snapshot is removed.
        """
        started = time.monotonic()
        try:
            await asyncio.to_thread(self._persist, image.path)
            manifest = dict(image.manifest)
            persisted = round((time.monotonic() - started) * 1000, 2)
            if manifest["memory"].get("digest") is None:
                digest = await asyncio.to_thread(image_digest, image.path / "memory")
                manifest["memory"] = {**manifest["memory"], "digest": digest}
            manifest.update(self._sizes(image.path, manifest["memory"]))
            capture_info = dict(manifest["capture"])
            capture_info["steps_ms"] = {**capture_info.get("steps_ms", {}), "persist": persisted}
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
    def _split(
        stream: BinaryIO, work: Path, ram_bytes: int, parent: ParentImage | None, written: WrittenPages | None
    ) -> _Split:
        """Split the stream into ``work``: ``memory`` as a layer over ``parent`` (pages ``written`` tells were
        changed) or, without one, whole; ``vmstate``."""
        tmp = work / ".memory.tmp"
        if parent is not None and written is not None:
            try:
                clone_parent(parent, tmp, ram_bytes)
            except VmmError as err:
                log.warning("snapshot memory written whole: %s", err.message)
                parent = None
        parent_fd = -1
        if parent is None or written is None:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, ram_bytes)
            sink: FullImage | LayerImage = FullImage(fd)
        else:
            fd = os.open(tmp, os.O_RDWR)
            parent_fd = os.open(parent.path, os.O_RDONLY)
            sink = LayerImage(fd, parent_fd, written, parent.digest)
        try:
            with open(work / "vmstate", "wb") as vmstate:
                stats = split_stream(stream, vmstate, sink)
            digest = sink.digest() if isinstance(sink, LayerImage) else None  # a full image's: by finish()
        finally:
            os.close(fd)
            if parent_fd >= 0:
                os.close(parent_fd)
        if stats.blocks.get("ram") != ram_bytes:
            raise VmmError(f"snapshot stream RAM block is {stats.blocks.get('ram')} bytes, expected {ram_bytes}")
        os.replace(tmp, work / "memory")
        layered = parent is not None and isinstance(sink, LayerImage)
        memory: dict[str, Any] = {
            "layered": layered,
            "parent": {"key": parent.key, "digest": parent.digest} if parent is not None and layered else None,
            "digest": digest,
            "own_pages": sink.own_pages,
            "unchanged_written_pages": sink.same_pages if isinstance(sink, LayerImage) else 0,
        }
        return _Split(stats, memory)

    @staticmethod
    def _persist(work: Path) -> None:
        """Every file durable (one thread each: their writebacks and log forces overlap) and read-only."""
        with ThreadPoolExecutor(len(FILES), thread_name_prefix="persist") as pool:
            list(pool.map(_fsync, [work / name for name in FILES]))
        for name in FILES:
            (work / name).chmod(0o444)

    @staticmethod
    def _sizes(work: Path, memory: dict[str, Any]) -> dict[str, int]:
        """``size_bytes`` (allocated, all files), ``unique_bytes`` (what only this snapshot holds: its own
        memory pages, device state, disk overlay) and ``shared_bytes`` (memory blocks shared with its parent)."""
        allocated = {name: allocated_bytes(work / name) for name in FILES}
        own_memory = memory["own_pages"] * PAGE_SIZE if memory.get("layered") else allocated["memory"]
        own_memory = min(own_memory, allocated["memory"])
        return {
            "size_bytes": sum(allocated.values()),
            "unique_bytes": own_memory + allocated["vmstate"] + allocated["disk.qcow2"],
            "shared_bytes": allocated["memory"] - own_memory,
        }

    def _manifest(
        self,
        snapshot_id: str,
        vm: MicroVM,
        info: CaptureInfo,
        report: CaptureReport[_Split],
        total_ms: float,
    ) -> dict[str, Any]:
        stats = report.result.stats
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
            "memory": {
                "bytes": vm.config.memory_mib << 20,
                "pages": stats.pages,
                "zero_pages": stats.zero_pages,
                **report.result.memory,
            },
            "capture": {
                "mode": report.mode,
                "phases_ms": report.phases_ms,
                "steps_ms": report.steps_ms,
                "counts": report.counts,
                "pause_ms": report.pause_ms,
                "migrate_ms": report.total_ms,
                "qemu_downtime_ms": report.qemu_downtime_ms,
                "prepopulate_ms": report.prepopulate_ms,
                "stream_bytes": stats.stream_bytes,
                "total_ms": round(total_ms, 1),
            },
        }


def _recorded_digest(image_dir: Path) -> str | None:
    """The memory digest a snapshot's (or hibernation's) manifest records, if ``image_dir`` is one."""
    try:
        manifest = json.loads((image_dir / "manifest.json").read_text())
        digest = manifest.get("memory", {}).get("digest") if manifest.get("format") == FORMAT_VERSION else None
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None
