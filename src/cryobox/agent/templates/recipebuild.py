"""Recipe builds: a Dockerfile's or E2B's steps turned into a template root filesystem, every step in a build VM.

The host only moves bytes: it fetches the steps' context archives from the object store and an image's layers from a
registry or from an uploaded image archive (:mod:`.recipebase`), writes them as opaque files onto the build VM's
inputs disk, and copies qcow2 layers. The build VM (:mod:`.buildsession`) unpacks, copies and runs everything. The
base (an image's unpacked layers) and each step's result are cached qcow2 layers (:mod:`.layercache`) keyed by
(parent key, step, context hash), on the host and in the object store (:mod:`.storelayers`), so a rebuild that
changes only the last step redoes only that step, on any host; the finished image is flattened into one raw ext4
(``<images>/rootfs-recipe/<key>/``), which the template bakes from like any other root filesystem. Build logs carry
the step they belong to (E2B's ``reason.step``): ``base``, the 1-based step index, or ``finalize``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CryoboxError, ImageBuildError, InvalidArgument
from ...image.builder import ImageSet, build_images
from ...image.cache import ContentCache
from ...image.recipe.config import StepState, final_config, states
from ...image.recipe.model import ImageConfig, Recipe, Step, step_key
from ...image.rootfs import Rootfs, make_ext4
from ...image.specs import BASE, TemplateSpec
from ...objstore import keys
from ...objstore.buildsteps import store_budget
from ...objstore.client import ObjectStore
from ...util.proc import Progress
from ..net.bakenet import bake_network
from ..vm import MachineConfig, NetAttach
from ..vm.jail import VmJail, one_off_uid
from .builder import INPUTS_BYTES, Builder, ensure_builder
from .buildsession import BuildSession, StepFailed, build_session
from .buildvm import BuildVmHost
from .layercache import LayerCache, cache_budget
from .recipebase import TARGET_BYTES, BaseImage, resolve_base
from .storelayers import StoreLayers

INPUTS_LABEL = "cryoinputs"

StepLog = Callable[[str, str, str], None]
"""Receives a build's log lines: (step, level, line)."""
NetFactory = Callable[[], AbstractAsyncContextManager[NetAttach]]


class RecipeBuildError(ImageBuildError):
    """A recipe build failed at ``step`` (``base``, a 1-based step index, or ``finalize``)."""

    def __init__(self, message: str, step: str, tail: list[str] | None = None) -> None:
        super().__init__(message, details={"step": step, "log_tail": (tail or [])[-20:]})
        self.step = step


@dataclass(frozen=True)
class RecipeServices:
    """What a recipe build needs of its agent (besides the host's build VM settings)."""

    store: ObjectStore
    network: NetFactory | None = None
    template_rootfs: Callable[[str], Path | None] = field(default=lambda _name: None)
    """The root filesystem image of a template this agent serves (a ``FROM`` another custom template)."""


@dataclass(frozen=True)
class RecipeImages:
    images: ImageSet
    config: ImageConfig


@dataclass(frozen=True)
class Plan:
    """One build: the recipe, where it starts, every layer's key, and what each step runs with."""

    recipe: Recipe
    base: BaseImage
    keys: list[str]
    """``keys[0]`` names the base (an image's unpacked layers), ``keys[i]`` the image after step ``i``."""
    states: list[StepState]
    log: StepLog

    @property
    def total(self) -> int:
        return len(self.recipe.steps)


def step_label(step: Step) -> str:
    args = step.args[1:] if step.op == "RUN" and step.args[:1] == ("exec",) else step.args
    return f"{step.op} {' '.join(args)}"[:200]


def _cached(layers: StoreLayers, plan: Plan) -> tuple[Path | None, list[Path]]:
    """The cached base layer (an image's unpack; ``None`` when it must be made) and steps 1..j (from this host's
    cache or the store's)."""
    recipe = plan.recipe
    if plan.base.layers is None:
        start: Path | None = plan.base.image
    else:
        start = None if recipe.force else layers.find(plan.keys[0], plan.base.image)
    found: list[Path] = []
    if start is None or recipe.force:
        return start, found
    for step, key in zip(recipe.steps, plan.keys[1:], strict=True):
        layer = None if step.force else layers.find(key, found[-1] if found else start)
        if layer is None:
            break
        found.append(layer)
    return start, found


async def recipe_images(
    services: RecipeServices, host: BuildVmHost, spec: TemplateSpec, progress: Progress, log: StepLog
) -> RecipeImages:
    """Build (or find cached) the root filesystem of ``spec.recipe``; its images and the image's exec defaults."""
    if spec.recipe is None:
        raise InvalidArgument("not a recipe template")
    recipe = Recipe.from_json(spec.recipe)
    images_dir = host.images_dir
    os_images = await asyncio.to_thread(build_images, images_dir, BASE, progress)
    pulls = host.run_dir / f"pull-{os.getpid()}-{spec.name}"
    try:
        try:
            base = await resolve_base(
                recipe,
                images_dir=images_dir,
                os_images=os_images,
                work=pulls,
                template_rootfs=services.template_rootfs,
                progress=lambda line: log("base", "info", line),
                store=services.store,
            )
        except CryoboxError as err:
            raise RecipeBuildError(err.message, "base") from err
        log("base", "info", f"FROM {base.description}")
        chain = [base.key]
        for step in recipe.steps:
            chain.append(step_key(chain[-1], step))
        plan = Plan(recipe, base, chain, states(recipe, base.config), log)
        layers = LayerCache(images_dir / "steps")
        shared = StoreLayers(services.store, layers, log=lambda line: log("finalize", "info", line))

        async def build(out: Path) -> None:
            start, cached = await asyncio.to_thread(_cached, shared, plan)
            for index, step in enumerate(recipe.steps[: len(cached)], start=1):
                log(str(index), "info", f"[{index}/{plan.total}] {step_label(step)} (cached)")
            image = out / "rootfs.ext4"
            if start is None or len(cached) < plan.total:
                await _run_in_vm(services, host, os_images, plan, start, cached, layers, image)
            else:
                log("finalize", "info", "writing the root filesystem image")
                await asyncio.to_thread(_flatten, cached[-1] if cached else start, image)
            await asyncio.to_thread(shared.after_build, plan.keys, store_budget())
            await asyncio.to_thread(layers.trim, cache_budget())

        path, built = await ContentCache(images_dir).aget_or_build("rootfs-recipe", {"recipe": chain[-1]}, build)
    finally:
        shutil.rmtree(pulls, ignore_errors=True)
    if not built:
        log("finalize", "info", "every step is cached")
    images = ImageSet(kernel=os_images.kernel, initramfs=os_images.initramfs, rootfs=Rootfs(path))
    return RecipeImages(images, final_config(recipe, base.config))


def _flatten(top: Path, image: Path) -> None:
    fmt = "qcow2" if top.suffix == ".qcow2" else "raw"
    subprocess.run(["qemu-img", "convert", "-f", fmt, "-O", "raw", str(top), str(image)], check=True)
    image.chmod(0o444)


async def _run_in_vm(
    services: RecipeServices,
    host: BuildVmHost,
    os_images: ImageSet,
    plan: Plan,
    start: Path | None,
    cached: list[Path],
    layers: LayerCache,
    image: Path,
) -> None:
    """Run what is not cached in one build VM (the base's unpack when ``start`` is ``None``, then the steps after
    ``cached``) and flatten the result into ``image``."""
    first = len(cached)
    inputs_dir = host.run_dir / f"inputs-{plan.keys[-1][:16]}-{os.getpid()}"
    shutil.rmtree(inputs_dir, ignore_errors=True)
    inputs_dir.mkdir(parents=True)
    unpack = plan.base.layers if start is None else None
    try:
        await asyncio.to_thread(_stage_inputs, services.store, plan.recipe.steps[first:], unpack, inputs_dir)
        staged = sum(p.stat().st_size for p in (inputs_dir / "staging").rglob("*") if p.is_file())
        restorable = services.network is not None and staged < INPUTS_BYTES * 3 // 4
        inputs = inputs_dir / "inputs.ext4"
        size = INPUTS_BYTES >> 20 if restorable else None
        # exactly INPUTS_BYTES (sparse) for a restored build VM, whose inputs disk has that size; else sized to fit
        await asyncio.to_thread(make_ext4, inputs_dir / "staging", inputs, INPUTS_LABEL, size_mib=size)
        shutil.rmtree(inputs_dir / "staging")
        machine = host.machine(os_images, nic=services.network is not None)
        base_log = _sink(plan.log, "base")
        async with host.queue.turn(lambda line: plan.log("base", "info", line)), contextlib.AsyncExitStack() as stack:
            net = await stack.enter_async_context(services.network()) if services.network is not None else None
            builder = await _builder(host, os_images, machine, plan) if restorable else None
            uid = stack.enter_context(one_off_uid(host.jail, host.run_dir))
            jail = VmJail(host.jail, uid) if host.jail is not None and uid is not None else None
            session = await stack.enter_async_context(
                build_session(
                    name=f"recipe-{plan.keys[-1][:20]}",
                    os_images=os_images,
                    machine=machine,
                    run_dir=host.run_dir,
                    target_base=cached[-1] if cached else (start or plan.base.image),
                    target_bytes=TARGET_BYTES,
                    inputs=inputs,
                    net=net,
                    jail=jail,
                    progress=lambda line: plan.log("base", "info", line),
                    builder=builder,
                )
            )
            parent: Path | None = cached[-1] if cached else start
            last: Path | None = None
            try:
                await session.driver(
                    "prepare", {"target": "/dev/vdb", "inputs": "/dev/vdc", "fresh": unpack is not None}, base_log
                )
                if unpack is not None:
                    await session.driver("unpack", {}, base_log)
                    await session.driver("ensure-user", {}, base_log)
                    last = await session.cut_layer(base_log)
                    parent = await asyncio.to_thread(layers.store, plan.keys[0], last, plan.base.image)
                else:
                    await session.shell("resize2fs /dev/vdb", base_log)
            except StepFailed as err:
                raise RecipeBuildError(f"preparing the image failed: {err.message}", "base", err.tail) from err
            for index in range(first + 1, plan.total + 1):
                last = await _step(session, plan, index)
                if parent is not None:
                    parent = await asyncio.to_thread(layers.store, plan.keys[index], last, parent)
            plan.log("finalize", "info", "writing the root filesystem image")
            await asyncio.to_thread(_flatten, last or session.top, image)  # while the session's layers exist
    finally:
        shutil.rmtree(inputs_dir, ignore_errors=True)


async def _builder(host: BuildVmHost, os_images: ImageSet, machine: MachineConfig, plan: Plan) -> Builder | None:
    """The host's baked build VM (baked now if this is the first build); ``None``: boot cold this time."""
    try:
        return await ensure_builder(
            host.images_dir,
            os_images,
            machine,
            host.run_dir,
            host.jail,
            bake_network,
            lambda line: plan.log("base", "info", line),
        )
    except (CryoboxError, OSError, subprocess.CalledProcessError) as err:
        plan.log("base", "info", f"no baked build VM ({err}); booting one")
        return None


async def _step(session: BuildSession, plan: Plan, index: int) -> Path:
    step = plan.recipe.steps[index - 1]
    label = str(index)
    plan.log(label, "info", f"[{index}/{plan.total}] {step_label(step)}")
    payload = {"step": _step_json(step), "state": plan.states[index - 1].to_json()}
    try:
        await session.driver("step", payload, _sink(plan.log, label))
    except StepFailed as err:
        raise RecipeBuildError(f"step {index} ({step_label(step)}) failed: {err.message}", label, err.tail) from err
    return await session.cut_layer(_sink(plan.log, label))


def _sink(log: StepLog, step: str) -> Callable[[str, str], None]:
    return lambda stream, line: log(step, "info", line)


def _step_json(step: Step) -> dict[str, object]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(step).items()}


def _stage_inputs(store: ObjectStore, steps: tuple[Step, ...], unpack: tuple[Path, ...] | None, work: Path) -> None:
    """The inputs disk's files: each COPY step's context archive as stored and an image's layer tars (opaque)."""
    contexts = work / "staging" / "contexts"
    contexts.mkdir(parents=True)
    for context in dict.fromkeys(s.context for s in steps if s.op == "COPY" and s.context):
        store.download(keys.build_context(context), contexts / f"{context}.tar.gz")
    if unpack is not None:
        layers = work / "staging" / "layers"
        layers.mkdir()
        for index, layer in enumerate(unpack):
            shutil.copyfile(layer, layers / f"{index:03d}.tar")


__all__ = ["RecipeBuildError", "RecipeImages", "RecipeServices", "StepLog", "recipe_images", "step_label"]
