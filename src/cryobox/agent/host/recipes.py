"""Recipe templates on a host: the services a build needs of it, and building once per fleet.

An agent asked to build a recipe template another agent has already built and published (the same recipe, size,
QEMU and accelerator) fetches that template from the object store instead of building it again (its step cache is
that host's, the template is everyone's). ``force``/``--no-cache`` builds always build.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config import Paths
from ...errors import ObjectNotFound
from ...image.builder import ImageSet, with_agent_disk
from ...image.recipe.model import Recipe
from ...image.specs import TemplateSpec
from ...objstore.client import ObjectStore
from ...objstore.keys import LAYOUT_VERSION, manifest_key, template_prefix
from ...util.proc import Progress
from ..net.buildnet import BuildNetwork
from ..publish.templates import fetch_template, latest_generation
from ..templates.bake import Template, qemu_version
from ..templates.buildvm import BuildVmHost
from ..templates.recipebuild import RecipeServices, StepLog, recipe_images
from ..templates.startcmd import baked_spec
from ..vm import Accel

if TYPE_CHECKING:
    from .startup import Host


def published_build(store: ObjectStore, spec: TemplateSpec, *, qemu: str, accel: str) -> bool:
    """Whether the newest published generation of ``spec.name`` was built from ``spec.recipe`` and restores here."""
    if spec.recipe is None or Recipe.from_json(spec.recipe).force:
        return False
    try:
        generation = latest_generation(store, spec.name)
        manifest: dict[str, Any] = json.loads(store.get(manifest_key(template_prefix(spec.name, generation))))
    except ObjectNotFound:
        return False
    published = manifest.get("spec") or {}
    machine = manifest.get("machine_config") or {}
    try:
        same_recipe = Recipe.from_json(published["recipe"]) == Recipe.from_json(spec.recipe)
    except (KeyError, TypeError, ValueError):
        return False
    return (
        same_recipe
        and manifest.get("layout") == LAYOUT_VERSION
        and manifest.get("qemu") == qemu
        and machine.get("accel") == accel
        and published.get("cpus") == spec.cpus
        and published.get("memory_mib") == spec.memory_mib
    )


async def build_recipe(
    paths: Paths,
    accel: Accel,
    services: RecipeServices,
    build_host: BuildVmHost,
    spec: TemplateSpec,
    progress: Progress,
    step_log: StepLog | None,
) -> Template | tuple[ImageSet, TemplateSpec]:
    """The published template when another agent built this recipe, else the images built here and the spec to
    bake them with (the image's defaults in it, booted with the agent disk)."""
    log = step_log or (lambda step, level, line: progress(line))
    qemu = qemu_version()
    if await asyncio.to_thread(published_build, services.store, spec, qemu=qemu, accel=accel.value):
        log("finalize", "info", "built and published by another agent: fetching it")
        return await asyncio.to_thread(
            fetch_template, services.store, spec.name, paths.templates_dir, paths.images_dir, qemu, progress
        )
    built = await recipe_images(services, build_host, spec, progress, log)
    baked = baked_spec(spec, built.config)
    images = await asyncio.to_thread(with_agent_disk, paths.images_dir, built.images, baked, progress)
    return images, baked


def recipe_services(host: Host) -> RecipeServices:
    """What recipe builds need of a running host: its store, a pooled slot with egress and DNS per build VM, and
    the root filesystems of the templates it serves (``FROM`` a custom template)."""

    def template_rootfs(name: str) -> Path | None:
        template = host.service.templates.get(name)
        rootfs = template.manifest.get("rootfs") if template is not None else None
        return Path(rootfs) if isinstance(rootfs, str) else None

    network = BuildNetwork(host.slots, host.egress)
    return RecipeServices(store=host.store, network=network.attach, template_rootfs=template_rootfs)


__all__ = ["build_recipe", "published_build", "recipe_services"]
