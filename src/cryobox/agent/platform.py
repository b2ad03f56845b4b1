"""Bring a host up: reclaim leftovers, build (or find) images, bake (or find) templates, start the service."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..config import Paths
from ..image.builder import ImageSet, build_images
from ..image.specs import DEFAULT_TEMPLATES, TemplateSpec
from ..util.proc import Progress
from .factory import PoolMode, VmFactory
from .reclaim import reclaim
from .service import SandboxService
from .templates import Template, TemplateBaker
from .vm import Accel, MachineConfig, detect_accel, host_tsc_khz


@dataclass(frozen=True)
class HostConfig:
    paths: Paths
    accel: Accel = field(default_factory=detect_accel)
    prespawn: int = 2
    pool_mode: PoolMode = PoolMode.WARM
    templates: tuple[TemplateSpec, ...] = DEFAULT_TEMPLATES


def machine_for(spec: TemplateSpec, images: ImageSet, accel: Accel, tsc_khz: int) -> MachineConfig:
    return MachineConfig(
        memory_mib=spec.memory_mib,
        cpus=spec.cpus,
        accel=accel,
        kernel=images.kernel.vmlinuz,
        initrd=images.initramfs.image,
        tsc_khz=tsc_khz,
        norandmaps=accel.default_norandmaps,
    )


async def prepare_template(config: HostConfig, spec: TemplateSpec, progress: Progress) -> Template:
    """Build the template's images and bake it unless a finished bake with the same inputs exists."""
    config.paths.ensure()
    baker = TemplateBaker(config.paths.templates_dir, config.paths.run_dir, progress)
    images = await asyncio.to_thread(build_images, config.paths.images_dir, spec, progress)
    return await baker.ensure(spec, images, machine_for(spec, images, config.accel, host_tsc_khz()))


async def prepare_templates(config: HostConfig, progress: Progress) -> dict[str, Template]:
    return {spec.name: await prepare_template(config, spec, progress) for spec in config.templates}


async def start_host(config: HostConfig, progress: Progress) -> SandboxService:
    config.paths.ensure()
    killed = await asyncio.to_thread(reclaim, config.paths.run_dir)
    if killed:
        progress(f"reclaimed {killed} leftover QEMU process(es)")
    templates = await prepare_templates(config, progress)
    service = SandboxService(
        templates, VmFactory(config.paths.run_dir), prespawn=config.prespawn, pool_mode=config.pool_mode
    )
    service.start()
    return service
