"""Bring a host up: reclaim leftovers, build (or find) images, bake (or find) templates, start the service."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ...config import Paths
from ...errors import InvalidArgument
from ...image.builder import ImageSet
from ...image.specs import DEFAULT_TEMPLATES, TemplateSpec
from ...objstore.client import ObjectStore, open_store
from ...util.proc import Progress
from ...util.progress import as_reporter
from ...util.steps import StepTimes
from ..crashpoints import CrashPoints
from ..disk.volume import Volume, ensure_volume, release_volume
from ..memory.client import MemoryServerProcess, MemServerConfig
from ..memory.hot import HotImages, default_budget
from ..memory.settings import MemoryMode, StorageConfig, TemplateSource
from ..net.bakenet import bake_network, reclaim_bakes
from ..net.denylist import deny_networks, endpoint_networks, exceptions_from_env
from ..net.egress.metrics import EgressMetrics
from ..net.egress.proxy import ProxyEnv
from ..net.egress.resolver import Resolver, upstream_from_env
from ..net.egress.service import EgressService
from ..net.firewall import Firewall
from ..net.netlink import host_networks
from ..net.netlink import reclaim as reclaim_net
from ..net.pool import SlotPool
from ..net.slots import SlotPlan, egress_mode_from_env, tag_for
from ..observe.sampler import ObserveConfig, SandboxObserver
from ..publish.prefetch import ensure_trace
from ..publish.templates import fetch_template, publish_template
from ..sandbox.factory import VmFactory
from ..sandbox.forking import Forking
from ..sandbox.memsource import MemorySource
from ..sandbox.pool import PoolMode
from ..sandbox.records import SandboxRecords
from ..sandbox.service import SandboxService
from ..snapshot.staging import StagingPool, reserve_from_env, start_warming
from ..snapshot.store import SnapshotStore
from ..templates.bake import Template, TemplateBaker, qemu_version, record_pins
from ..templates.buildvm import BuildQueue, BuildVmHost, images_for
from ..templates.localize import Localizer
from ..templates.recipebuild import RecipeServices, StepLog
from ..vm import Accel, MachineConfig, detect_accel, host_tsc_khz
from ..vm.consolelog import LogCapper
from ..vm.jail import JailSettings, prepare_host
from ..vm.slots import RO_SLOTS, RW_SLOTS
from ..vm.volumewarm import ensure_image
from ..volumes.store import VolumeStore
from .adopt import adopt, survey, sweep_hibernation
from .bakereclaim import reclaim_bakes_dirs
from .ownership import Ownership
from .recipes import build_recipe
from .reclaim import reclaim
from .started import Started
from .stopmode import OnStop

log = logging.getLogger(__name__)
ADOPTED_POOL_DELAY_S = 2.0  # pools fill late after a restart that adopted sandboxes (docs/design/operations.md)


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
        agent_disk=images.agent_disk.image if images.agent_disk is not None else None,
        rw_volume_slots=RW_SLOTS,
        ro_volume_slots=RO_SLOTS,
    )


async def prepare_template(
    config: HostConfig,
    spec: TemplateSpec,
    progress: Progress,
    queue: BuildQueue | None = None,
    *,
    recipe: RecipeServices | None = None,
    step_log: StepLog | None = None,
) -> Template:
    """Build the template's images (what a custom template adds, or its recipe's steps, in a build VM waiting in
    ``queue``) and bake it unless a finished bake with the same inputs exists; publish it to the object store
    unless it is there already. ``recipe``: what a recipe build needs of the agent (its network, its store)."""
    config.paths.ensure()
    jail = JailSettings.for_tag(tag_for(config.paths.data_dir))
    if jail is not None:
        await asyncio.to_thread(prepare_host, jail)
    baker = TemplateBaker(config.paths.templates_dir, config.paths.bake_dir, progress, bake_network, jail)
    tsc_khz = host_tsc_khz()
    build_host = BuildVmHost(
        config.paths.images_dir, config.paths.bake_dir, config.accel, tsc_khz, jail, queue or BuildQueue.from_env()
    )
    if spec.recipe is not None:
        if recipe is None:
            raise InvalidArgument("this agent builds no recipe templates (no build services)")
        built = await build_recipe(config.paths, config.accel, recipe, build_host, spec, progress, step_log)
        if isinstance(built, Template):
            return built  # built and published by another agent: fetched
        images, spec = built
    else:
        images = await images_for(build_host, spec, progress)
    template = await baker.ensure(spec, images, machine_for(spec, images, config.accel, tsc_khz))
    store = await asyncio.to_thread(open_store, config.resolved_store_url)
    pins = await asyncio.to_thread(publish_template, store, template, config.paths.images_dir, progress)
    return await asyncio.to_thread(record_pins, template, pins.to_json())  # lazy restores name the index by it


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
    """Every template of ``config``, built and baked side by side (their debootstraps and cold boots overlap;
    a part they share, like the kernel, is built once: the image cache makes the others wait for it)."""
    phase = as_reporter(progress).phase("templates", total=len(config.templates))

    async def one(spec: TemplateSpec) -> Template:
        template = await prepare_template(config, spec, progress)
        phase.advance()
        return template

    try:
        with phase:
            built = await asyncio.gather(*(one(spec) for spec in config.templates))
    finally:
        jail = JailSettings.for_tag(tag_for(config.paths.data_dir))
        if jail is not None and jail.cgroups is not None:
            # the bakes' VMs are gone: their per-agent cgroup directories too (kept while any VM still uses them)
            await asyncio.to_thread(jail.cgroups.remove_base)
    return {template.name: template for template in built}


@dataclass
class Host:
    """Everything one agent process runs; :meth:`close` stops it (idempotent)."""

    config: HostConfig
    volume: Volume
    hot: HotImages
    service: SandboxService
    snapshots: SnapshotStore
    forking: Forking
    slots: SlotPool
    firewall: Firewall
    egress: EgressService
    store: ObjectStore
    memserver: MemoryServerProcess
    localizer: Localizer
    lost: list[str] = field(default_factory=list)
    """Sandboxes whose records named a VM that did not survive the previous agent."""
    ownership: Ownership | None = None
    jail: JailSettings | None = None
    jail_weakened: list[str] = field(default_factory=list)
    logs: LogCapper | None = None
    """What the host gave up so jailed QEMUs work (see :func:`.vm.jail.prepare_host`)."""
    warming: asyncio.Task[None] | None = None
    """Faulting in the snapshot staging reserve (:meth:`.vm.staging.StagingPool.warm`), in the background."""
    observer: SandboxObserver | None = None
    """Each sandbox's samples and log (:mod:`..observe`)."""
    volumes: VolumeStore | None = None
    """The images of the volumes this host holds (:mod:`..volumes`)."""
    _closed: bool = False

    async def close(
        self, on_stop: OnStop = OnStop.KILL, release: bool = True, released: Callable[[], object] | None = None
    ) -> None:
        """Stop the agent's host side. ``KEEP`` leaves running sandboxes' QEMUs, slots, hot
        memory, the memory server and the volume mount in place for the next agent; ``HIBERNATE`` hibernates
        every sandbox first and then stops everything but their images and records; ``KILL`` removes it all.
        ``released`` is called once the data dir's lock is let go (a process that ends with this stop gives way
        to its successor there: :func:`cryobox.util.system.yield_cpu`)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._close(on_stop, release)
        finally:
            if self.ownership is not None:
                self.ownership.release()
            if released is not None:
                released()
            # process-private memory: unmapped after the lock is let go (~0.1 s a restart's successor, or a
            # standby, need not wait for)
            self.snapshots.staging.close()

    async def _close(self, on_stop: OnStop, release: bool) -> None:
        if self.observer is not None:
            await self.observer.close()
        if self.logs is not None:
            await self.logs.close()
        if on_stop is OnStop.HIBERNATE:
            failed = await self.service.hibernate_all()
            on_stop = OnStop.KEEP if failed else OnStop.HIBERNATE
        keep = on_stop is not OnStop.KILL
        await self.service.close(keep=keep)
        await self.egress.close()  # with KEEP too: the next agent serves the adopted slots again
        if self.warming is not None:
            self.warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.warming
        await self.localizer.close()
        if on_stop is OnStop.KEEP:
            await self.memserver.aclose(keep=True)
            await self.slots.detach()
            return
        await self.memserver.aclose()  # after every VM mapping its files is gone
        await self.slots.close()
        await asyncio.to_thread(self.firewall.remove)
        await asyncio.to_thread(self.hot.close)
        if self.jail is not None and self.jail.cgroups is not None:
            await asyncio.to_thread(self.jail.cgroups.reclaim)
            await asyncio.to_thread(self.jail.cgroups.remove_base)
        if release and self.volume.image is not None:
            await asyncio.to_thread(release_volume, self.config.paths.data_dir)


async def start_host(config: HostConfig, progress: Progress) -> Host:
    """Mount the data volume, adopt the VMs a previous agent left running, reclaim the rest of what it left
    behind, make sure templates exist, start. A failure at any step undoes the steps before it."""
    started = Started()
    try:
        return await _start_host(config, progress, started)
    except BaseException:
        await started.undo(config.paths.data_dir)
        raise


async def _start_host(config: HostConfig, progress: Progress, started: Started) -> Host:
    paths = config.paths
    paths.ensure()
    # one agent per data dir (StateError if another holds it); the owner record lets `cryobox gc` find what
    # this data dir's agents leave on the host
    jail = JailSettings.for_tag(tag_for(paths.data_dir))
    uid_base = jail.uid_base if jail is not None else None
    times = StepTimes("host start")  # logged as one line: where an adopting restart's start goes
    times.begin()
    ownership = started.ownership = await asyncio.to_thread(Ownership(paths).claim, uid_base)
    volume = started.volume = await asyncio.to_thread(ensure_volume, paths.data_dir)
    times.mark("volume")
    progress(f"data volume {volume.root} ({'reflink' if volume.reflink else 'copy'}, image {volume.image})")
    records = SandboxRecords(paths.records_dir)
    found = await asyncio.to_thread(survey, records, paths.run_dir)
    started.adopted = bool(found.live)
    killed = await asyncio.to_thread(functools.partial(reclaim, paths.run_dir, keep=found.keep_vms()))
    times.mark("survey and reclaim")
    if killed:
        progress(f"reclaimed {killed} leftover QEMU process(es)")
    tag = tag_for(paths.data_dir)
    weakened = await asyncio.to_thread(prepare_host, jail) if jail is not None else []
    if jail is not None and jail.cgroups is not None:
        await asyncio.to_thread(jail.cgroups.reclaim, set(found.keep_vms()))
    adopted_cidr = found.slot_cidr()
    if adopted_cidr is None:
        await asyncio.to_thread(reclaim_net, tag)

    def pick(taken: list[ipaddress.IPv4Network]) -> str:
        return adopted_cidr if adopted_cidr is not None else SlotPlan.from_env(tag, taken=taken).cidr

    cidr = await asyncio.to_thread(ownership.claim_slots, pick, host_networks)
    plan = SlotPlan(tag, cidr, egress=egress_mode_from_env())
    leftovers = await asyncio.to_thread(functools.partial(reclaim_net, tag, found.slots(plan), defer=True))
    await asyncio.to_thread(reclaim_bakes)
    await asyncio.to_thread(reclaim_bakes_dirs, paths.bake_dir, paths.templates_dir)
    times.mark("network reclaim")
    endpoints = endpoint_networks([config.resolved_store_url, os.environ.get("CRYOBOX_DATABASE_URL")])
    own = await asyncio.to_thread(host_networks)
    times.mark("routes")
    deny = deny_networks([*own, *endpoints], exceptions_from_env())
    firewall = started.firewall = Firewall(plan, floor=deny)
    times.mark("floor")
    # loaded beside the steps below (its nft run took 0.14-0.2 s of a restart's start with 50 busy VMs under TCG);
    # a restart that adopts VMs finds the previous agent's table, under which their traffic runs on until this one
    # replaces it in one transaction, and waits for it only before its pools start
    firewalling = started.firewalling = asyncio.ensure_future(
        asyncio.to_thread(functools.partial(firewall.ensure, fresh=True))
    )
    slots = started.slots = SlotPool(plan, size=config.net_pool)
    slots.reclaim_later(leftovers.deferred)  # destroyed in the background once the pool starts
    egress_metrics = EgressMetrics()
    egress = started.egress = EgressService(
        ProxyEnv(Resolver(upstream_from_env()), floor=deny, observer=egress_metrics),
        metrics=egress_metrics,
        mode=plan.egress,
    )
    times.mark("egress service")
    progress(f"network slots from {plan.cidr} (tag {plan.tag}, {config.net_pool} pre-built)")
    hot = HotImages(paths.hot_dir, default_budget(paths.hot_dir))
    await asyncio.to_thread(hot.wipe, found.hot_keys(hot))
    times.mark("hot memory")
    snapshots = SnapshotStore(
        paths.snapshots_dir, hot, qemu_version(), staging=StagingPool(reserve_bytes=reserve_from_env())
    )
    hibernation = SnapshotStore(paths.hibernate_dir, hot, qemu_version(), bases=snapshots.bases)
    times.mark("snapshot stores")
    for partial in await asyncio.to_thread(snapshots.sweep_partials):
        log.info("removed unfinished snapshot %s", partial)
    await asyncio.to_thread(sweep_hibernation, hibernation, found.hibernation_dirs())
    store = await asyncio.to_thread(open_store, config.resolved_store_url)
    times.mark("images and store")
    memserver_config = config.memserver_config()
    if jail is not None:
        memserver_config = dataclasses.replace(memserver_config, image_gid=jail.image_gid)
    memserver = started.memserver = MemoryServerProcess(memserver_config)
    reattached = await asyncio.to_thread(memserver.start)
    times.mark("memory server")
    progress(
        f"memory server on {memserver.config.mount} ({'reattached, ' if reattached else ''}store {store.url}, "
        f"memory {config.storage.memory_mode.value})"
    )
    warmup = await asyncio.to_thread(ensure_image, paths.images_dir) if config.pool_mode.preloads_state else None
    factory = VmFactory(
        paths.run_dir,
        hot,
        slots,
        egress,
        MemorySource(hot, memserver, config.storage.memory_mode, config.storage.prefetch),
        jail,
        volume_warmup=warmup,
    )
    hot.in_use = factory.mapped_hot_keys
    service = SandboxService(
        {},
        factory,
        hibernation,
        prespawn=config.prespawn,
        pool_mode=config.pool_mode,
        records=records,
        crash=CrashPoints.from_env(),
    )
    lost = await adopt(service, found, hibernation)
    times.mark("adopted")
    if found.live or found.hibernated:
        progress(f"adopted {len(service.sandboxes)} sandbox(es) from the previous agent ({len(lost)} lost)")
    if not found.live:  # a first start has no table yet: nothing of it gets a network before the table is loaded
        await firewalling
    slots.start()
    templates = await obtain_templates(config, store, progress)
    times.mark("templates")
    for template in templates.values():
        try:
            await ensure_trace(factory, memserver, store, template)
        except Exception as err:  # restores still work without a trace, only without prefetch
            log.warning("could not record the prefetch trace of %s: %s", template.name, err)
    await firewalling
    times.mark("firewall")
    for template in templates.values():  # after a restart the adopted sandboxes' requests go first
        service.add_template(template, refill_after_s=ADOPTED_POOL_DELAY_S if found.live else 0.0)
    # copies of older generations' memory on the volume: snapshots cloned from them keep their blocks
    stale = await asyncio.to_thread(snapshots.bases.prune, {t.hot_key for t in templates.values()})
    if stale:
        log.info("removed %d volume copies of older template images", len(stale))
    localizer = Localizer(memserver)
    if config.storage.memory_mode is MemoryMode.HOT and localizer.start(templates.values()):
        progress("bringing fetched templates' memory home in the background")
    forking = Forking(service, snapshots)
    observer = SandboxObserver(service, ObserveConfig.from_env())  # a bad setting fails before anything starts
    logs = LogCapper([paths.run_dir, paths.bake_dir])
    logs.start()
    observer.start()
    if jail is None:
        progress("jail: OFF (CRYOBOX_JAIL=off): QEMU runs as this process's user, unconfined")
    else:
        cg = f"cgroup v{jail.cgroups.version}" if jail.cgroups is not None else "no cgroup controllers"
        progress(
            f"jail: uids {jail.uid_range.start}-{jail.uid_range.stop - 1}, mount/pid/ipc namespaces, seccomp, {cg}"
        )
        for item in weakened:
            progress(f"jail: host setting weakened: {item}")
    times.mark("started")
    progress(times.describe())
    if config.accel is Accel.TCG:
        progress("accelerator TCG: QEMU's emulator is not a security boundary upstream; the jail is what confines it")
    return Host(
        config,
        volume,
        hot,
        service,
        snapshots,
        forking,
        slots,
        firewall,
        egress,
        store,
        memserver,
        localizer,
        lost,
        ownership,
        jail,
        weakened,
        logs,
        start_warming(snapshots.staging),
        observer=observer,
        volumes=VolumeStore(config.paths.volumes_dir, swept=True),
    )
