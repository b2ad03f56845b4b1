"""Recipe builds: a Dockerfile's or E2B's steps turned into a template root filesystem, every step in a build VM.

The host only moves bytes: it fetches the steps' context archives from the object store and an image's layers
from a registry, writes them as opaque files onto the build VM's inputs disk, and copies qcow2 layers. The build
VM (:mod:`.buildsession`) unpacks, copies and runs everything. Each step's result is a cached qcow2 layer
(:mod:`.layercache`) keyed by (parent key, step, context hash), so a rebuild that changes only the last step redoes
only that step; the finished image is flattened into one raw ext4 (``<images>/rootfs-recipe/<key>/``), which the
template bakes from like any other root filesystem. Build logs carry the step they belong to (E2B's
``reason.step``): ``base``, the 1-based step index, or ``finalize``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import shutil
import subprocess
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ImageBuildError, InvalidArgument
from ...image.builder import ImageSet, build_images
from ...image.cache import ContentCache
from ...image.recipe.config import StepState, final_config, states
from ...image.recipe.model import ImageConfig, Recipe, Step, step_key
from ...image.rootfs import Rootfs, make_ext4
from ...image.specs import BASE, TemplateSpec, by_name
from ...objstore import keys
from ...objstore.client import ObjectStore
from ...util.proc import Progress
from ..vm import MachineConfig, NetAttach
from ..vm.jail import VmJail, one_off_uid
from .buildsession import BUILD_MEMORY_MIB, BuildSession, StepFailed, build_session
from .buildvm import BuildVmHost
from .layercache import LayerCache, cache_budget

BUILD_FORMAT = 1
TARGET_BYTES = 8 << 30
"""The virtual size of a built image's disk (sparse; the filesystem is grown to it in the build VM)."""
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
class BaseImage:
    key: str
    image: Path
    config: ImageConfig | None
    description: str


@dataclass(frozen=True)
class RecipeImages:
    images: ImageSet
    config: ImageConfig


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def step_label(index: int, step: Step) -> str:
    args = " ".join(step.args[1:] if step.op == "RUN" and step.args[:1] == ("exec",) else step.args)
    return f"{step.op} {args}"[:200]


async def _base(
    services: RecipeServices, host: BuildVmHost, recipe: Recipe, os_images: ImageSet, progress: Progress
) -> BaseImage:
    kind, ref = recipe.base.kind, recipe.base.ref
    if kind == "debian":
        if ref != "bookworm":
            raise InvalidArgument(f"Debian {ref!r} is not a base cryobox builds (bookworm is)", details={"base": ref})
        image = os_images.rootfs.image
        return BaseImage(_digest(str(BUILD_FORMAT), "rootfs", image.parent.name), image, None, "Debian bookworm")
    if kind == "template":
        builtin = by_name(ref)
        if builtin is not None and not builtin.added_packages and not builtin.added_pip:
            images = await asyncio.to_thread(build_images, host.images_dir, builtin, progress)
            image = images.rootfs.image
        else:
            found = services.template_rootfs(ref)
            if found is None:
                raise InvalidArgument(f"no template {ref!r} to build from on this agent", details={"template": ref})
            image = found
        return BaseImage(_digest(str(BUILD_FORMAT), "rootfs", str(image)), image, None, f"template {ref}")
    raise InvalidArgument(
        f"building from the image {ref!r} needs an OCI registry pull, which this agent does not offer yet",
        details={"image": ref},
    )


def _cached_prefix(layers: LayerCache, recipe: Recipe, chain_keys: list[str]) -> list[Path]:
    """The cached layers of steps 1..j (j as large as possible, stopping at a forced step)."""
    found: list[Path] = []
    if recipe.force:
        return found
    for step, key in zip(recipe.steps, chain_keys[1:], strict=True):
        if step.force:
            break
        layer = layers.lookup(key)
        if layer is None:
            break
        found.append(layer)
    return found


async def recipe_images(
    services: RecipeServices, host: BuildVmHost, spec: TemplateSpec, progress: Progress, log: StepLog
) -> RecipeImages:
    """Build (or find cached) the root filesystem of ``spec.recipe``; its images and the image's exec defaults."""
    if spec.recipe is None:
        raise InvalidArgument("not a recipe template")
    recipe = Recipe.from_json(spec.recipe)
    images_dir = host.images_dir
    os_images = await asyncio.to_thread(build_images, images_dir, BASE, progress)
    try:
        base = await _base(services, host, recipe, os_images, progress)
    except InvalidArgument as err:
        raise RecipeBuildError(err.message, "base") from err
    log("base", "info", f"FROM {base.description}")
    chain_keys = [base.key]
    for step in recipe.steps:
        chain_keys.append(step_key(chain_keys[-1], step))
    step_states = states(recipe, base.config)
    layers = LayerCache(images_dir / "steps")

    async def build(out: Path) -> None:
        cached = _cached_prefix(layers, recipe, chain_keys)
        for index, step in enumerate(recipe.steps[: len(cached)], start=1):
            log(str(index), "info", f"[{index}/{len(recipe.steps)}] {step_label(index, step)} (cached)")
        image = out / "rootfs.ext4"
        if len(cached) < len(recipe.steps):
            await _run_steps(
                services, host, recipe, os_images, chain_keys, step_states, cached, base, layers, log, image
            )
        else:
            log("finalize", "info", "writing the root filesystem image")
            await asyncio.to_thread(_flatten, cached[-1] if cached else base.image, image)
        await asyncio.to_thread(layers.trim, cache_budget())

    path, built = await ContentCache(images_dir).aget_or_build("rootfs-recipe", {"recipe": chain_keys[-1]}, build)
    if not built:
        log("finalize", "info", "every step is cached")
    images = ImageSet(kernel=os_images.kernel, initramfs=os_images.initramfs, rootfs=Rootfs(path))
    return RecipeImages(images, final_config(recipe, base.config))


def _flatten(top: Path, image: Path) -> None:
    fmt = "qcow2" if top.suffix == ".qcow2" else "raw"
    subprocess.run(["qemu-img", "convert", "-f", fmt, "-O", "raw", str(top), str(image)], check=True)
    image.chmod(0o444)


async def _run_steps(
    services: RecipeServices,
    host: BuildVmHost,
    recipe: Recipe,
    os_images: ImageSet,
    chain_keys: list[str],
    step_states: list[StepState],
    cached: list[Path],
    base: BaseImage,
    layers: LayerCache,
    log: StepLog,
    image: Path,
) -> None:
    """Run the steps after the cached prefix in one build VM and flatten the result into ``image``."""
    first = len(cached)
    todo = recipe.steps[first:]
    inputs_dir = host.run_dir / f"inputs-{chain_keys[-1][:16]}"
    shutil.rmtree(inputs_dir, ignore_errors=True)
    inputs_dir.mkdir(parents=True)
    try:
        await asyncio.to_thread(_stage_inputs, services.store, todo, inputs_dir / "staging")
        inputs = inputs_dir / "inputs.ext4"
        await asyncio.to_thread(make_ext4, inputs_dir / "staging", inputs, INPUTS_LABEL)
        machine = MachineConfig(
            memory_mib=BUILD_MEMORY_MIB,
            cpus=1,
            accel=host.accel,
            kernel=os_images.kernel.vmlinuz,
            initrd=os_images.initramfs.image,
            tsc_khz=host.tsc_khz,
            norandmaps=host.accel.default_norandmaps,
            nic=services.network is not None,
        )
        async with host.queue.turn(lambda line: log("base", "info", line)), contextlib.AsyncExitStack() as stack:
            net = await stack.enter_async_context(services.network()) if services.network is not None else None
            uid = stack.enter_context(one_off_uid(host.jail, host.run_dir))
            jail = VmJail(host.jail, uid) if host.jail is not None and uid is not None else None
            session = await stack.enter_async_context(
                build_session(
                    name=f"recipe-{chain_keys[-1][:20]}",
                    os_images=os_images,
                    machine=machine,
                    run_dir=host.run_dir,
                    target_base=cached[-1] if cached else base.image,
                    target_bytes=TARGET_BYTES,
                    inputs=inputs,
                    net=net,
                    jail=jail,
                    progress=lambda line: log("base", "info", line),
                )
            )
            last = await _steps_in(session, recipe, chain_keys, step_states, cached, base, layers, log)
            log("finalize", "info", "writing the root filesystem image")
            await asyncio.to_thread(_flatten, last, image)  # while the session's layers still exist
    finally:
        shutil.rmtree(inputs_dir, ignore_errors=True)


async def _steps_in(
    session: BuildSession,
    recipe: Recipe,
    chain_keys: list[str],
    step_states: list[StepState],
    cached: list[Path],
    base: BaseImage,
    layers: LayerCache,
    log: StepLog,
) -> Path:
    first = len(cached)
    parent: Path | None = cached[-1] if cached else base.image
    try:
        await session.driver(
            "prepare", {"target": "/dev/vdb", "inputs": "/dev/vdc", "fresh": False}, _sink(log, "base")
        )
        await session.shell("resize2fs /dev/vdb", _sink(log, "base"))
    except StepFailed as err:
        raise RecipeBuildError(f"preparing the build VM failed: {err.message}", "base", err.tail) from err
    last: Path | None = None
    for offset, step in enumerate(recipe.steps[first:]):
        index = first + offset + 1
        label = str(index)
        log(label, "info", f"[{index}/{len(recipe.steps)}] {step_label(index, step)}")
        payload = {"step": _step_json(step), "state": step_states[index - 1].to_json()}
        try:
            await session.driver("step", payload, _sink(log, label))
        except StepFailed as err:
            raise RecipeBuildError(
                f"step {index} ({step_label(index, step)}) failed: {err.message}", label, err.tail
            ) from err
        last = await session.cut_layer(_sink(log, label))
        if parent is not None:
            parent = await asyncio.to_thread(layers.store, chain_keys[index], last, parent)
    assert last is not None
    return last


def _sink(log: StepLog, step: str) -> Callable[[str, str], None]:
    return lambda stream, line: log(step, "info", line)


def _step_json(step: Step) -> dict[str, object]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(step).items()}


def _stage_inputs(store: ObjectStore, steps: tuple[Step, ...], staging: Path) -> None:
    """The inputs disk's files: each COPY step's context archive, as stored (opaque to the host)."""
    contexts = staging / "contexts"
    contexts.mkdir(parents=True)
    for context in dict.fromkeys(s.context for s in steps if s.op == "COPY" and s.context):
        store.download(keys.build_context(context), contexts / f"{context}.tar.gz")


__all__ = ["RecipeBuildError", "RecipeImages", "RecipeServices", "StepLog", "recipe_images"]
