"""Bring a host up: reclaim leftovers, build (or find) images, bake (or find) templates, start the service."""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
from dataclasses import dataclass, field

from ..config import Paths
from ..image.builder import ImageSet, build_images
from ..image.specs import DEFAULT_TEMPLATES, TemplateSpec
from ..util.proc import Progress
from .factory import PoolMode, VmFactory
from .forking import Forking
from .localize import Localizer
from .memsource import MemorySource
from .net.bakenet import bake_network, reclaim_bakes
from .net.firewall import Firewall
from .net.netlink import host_networks
from .net.netlink import reclaim as reclaim_net
from .net.pool import SlotPool
from .net.slots import SlotPlan, tag_for
from .prefetch import ensure_trace
from .reclaim import reclaim
from .service import SandboxService
from .storage import MemoryMode, StorageConfig, TemplateSource
from .store.hot import HotImages
from .store.memclient import MemoryServerProcess, MemServerConfig
from .store.objstore import ObjectStore, open_store
from .store.publish import fetch_template, publish_template
from .store.snapshots import SnapshotStore
from .store.volume import Volume, ensure_volume, release_volume
from .templates import Template, TemplateBaker, qemu_version
from .vm import Accel, MachineConfig, detect_accel, host_tsc_khz

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostConfig:
    paths: Paths
    accel: Accel = field(default_factory=detect_accel)
    prespawn: int = 2
    pool_mode: PoolMode = PoolMode.WARM
    net_pool: int = 16
    """Network slots kept pre-built (``--net-pool``); creating one is never on a warm create path."""
    templates: tuple[TemplateSpec, ...] = DEFAULT_TEMPLATES
    storage: StorageConfig = field(default_factory=StorageConfig)

    @property
    def resolved_store_url(self) -> str:
        return self.storage.store_url or self.paths.default_store_url

    def memserver_config(self) -> MemServerConfig:
        return MemServerConfig(
            root=self.paths.memserver_dir,
            store_url=self.resolved_store_url,
            cache_dir=self.paths.chunk_cache_dir,
            cache_budget_bytes=self.storage.chunk_cache_bytes,
            faults=self.storage.store_faults,
            naive=self.storage.naive_memory,
            fetch_deadline_s=self.storage.fetch_deadline_s,
        )


def machine_for(spec: TemplateSpec, images: ImageSet, accel: Accel, tsc_khz: int) -> MachineConfig:
    return MachineConfig(
        memory_mib=spec.memory_mib,
        cpus=spec.cpus,
        accel=accel,
        kernel=images.kernel.vmlinuz,
        initrd=images.initramfs.image,
        tsc_khz=tsc_khz,
        norandmaps=accel.default_norandmaps,
        nic=True,
    )


async def prepare_template(config: HostConfig, spec: TemplateSpec, progress: Progress) -> Template:
    """Build the template's images and bake it unless a finished bake with the same inputs exists; publish it
    to the object store unless it is there already."""
    config.paths.ensure()
    baker = TemplateBaker(config.paths.templates_dir, config.paths.bake_dir, progress, bake_network)
    images = await asyncio.to_thread(build_images, config.paths.images_dir, spec, progress)
    template = await baker.ensure(spec, images, machine_for(spec, images, config.accel, host_tsc_khz()))
    store = await asyncio.to_thread(open_store, config.resolved_store_url)
    work = config.paths.cache_dir / ".publish"
    await asyncio.to_thread(publish_template, store, template, config.paths.images_dir, work, progress)
    return template


async def obtain_templates(config: HostConfig, store: ObjectStore, progress: Progress) -> dict[str, Template]:
    """Bake (and publish) the templates here, or fetch the published ones from the store."""
    if config.storage.template_source is TemplateSource.BUILD:
        return await prepare_templates(config, progress)
    paths, qemu = config.paths, qemu_version()
    return {
        spec.name: await asyncio.to_thread(
            fetch_template, store, spec.name, paths.templates_dir, paths.images_dir, qemu, progress
        )
        for spec in config.templates
    }


async def prepare_templates(config: HostConfig, progress: Progress) -> dict[str, Template]:
    return {spec.name: await prepare_template(config, spec, progress) for spec in config.templates}


@dataclass
class Host:
    """Everything one agent process runs; :meth:`close` stops it all (idempotent)."""

    config: HostConfig
    volume: Volume
    hot: HotImages
    service: SandboxService
    snapshots: SnapshotStore
    forking: Forking
    slots: SlotPool
    firewall: Firewall
    store: ObjectStore
    memserver: MemoryServerProcess
    localizer: Localizer

    async def close(self, release: bool = True) -> None:
        await self.service.close()
        await self.localizer.close()
        await self.memserver.aclose()  # after every VM mapping its files is gone
        await self.slots.close()
        await asyncio.to_thread(self.firewall.remove)
        await asyncio.to_thread(self.hot.close)
        if release and self.volume.image is not None:
            await asyncio.to_thread(release_volume, self.config.paths.data_dir)


async def start_host(config: HostConfig, progress: Progress) -> Host:
    """Mount the data volume, reclaim what a previous agent left behind, make sure templates exist, start."""
    paths = config.paths
    paths.ensure()
    volume = await asyncio.to_thread(ensure_volume, paths.data_dir)
    progress(f"data volume {volume.root} ({'reflink' if volume.reflink else 'copy'}, image {volume.image})")
    killed = await asyncio.to_thread(reclaim, paths.run_dir)
    if killed:
        progress(f"reclaimed {killed} leftover QEMU process(es)")
    tag = tag_for(paths.data_dir)
    await asyncio.to_thread(reclaim_net, tag)
    plan = SlotPlan.from_env(tag, taken=await asyncio.to_thread(host_networks))
    await asyncio.to_thread(reclaim_bakes)
    firewall = Firewall(plan)
    await asyncio.to_thread(functools.partial(firewall.ensure, fresh=True))
    slots = SlotPool(plan, size=config.net_pool, egress=firewall)
    slots.start()
    progress(f"network slots from {plan.cidr} (tag {plan.tag}, {config.net_pool} pre-built)")
    hot = HotImages(paths.hot_dir)
    await asyncio.to_thread(hot.wipe)
    shutil.rmtree(paths.hibernate_dir, ignore_errors=True)  # hibernated sandboxes do not survive the agent
    snapshots = SnapshotStore(paths.snapshots_dir, hot, qemu_version())
    hibernation = SnapshotStore(paths.hibernate_dir, hot, qemu_version())
    for partial in await asyncio.to_thread(snapshots.sweep_partials):
        log.info("removed unfinished snapshot %s", partial)
    store = await asyncio.to_thread(open_store, config.resolved_store_url)
    memserver = MemoryServerProcess(config.memserver_config())
    await asyncio.to_thread(memserver.start)
    progress(
        f"memory server on {memserver.config.mount} (store {store.url}, memory {config.storage.memory_mode.value})"
    )
    try:
        templates = await obtain_templates(config, store, progress)
        factory = VmFactory(
            paths.run_dir,
            hot,
            slots,
            firewall,
            MemorySource(hot, memserver, config.storage.memory_mode, config.storage.prefetch),
        )
        for template in templates.values():
            try:
                await ensure_trace(factory, memserver, store, template)
            except Exception as err:  # restores still work without a trace, only without prefetch
                log.warning("could not record the prefetch trace of %s: %s", template.name, err)
    except BaseException:
        await memserver.aclose()
        raise
    service = SandboxService(templates, factory, hibernation, prespawn=config.prespawn, pool_mode=config.pool_mode)
    service.start()
    localizer = Localizer(memserver)
    if config.storage.memory_mode is MemoryMode.HOT and localizer.start(templates.values()):
        progress("bringing fetched templates' memory home in the background")
    forking = Forking(service, snapshots)
    return Host(config, volume, hot, service, snapshots, forking, slots, firewall, store, memserver, localizer)
