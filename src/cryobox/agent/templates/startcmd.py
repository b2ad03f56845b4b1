"""A recipe template's start command, started during the bake and baked alive once its ready check passes.

The image's defaults (``ENV``, ``WORKDIR``, ``USER`` and the start command: :class:`ImageConfig`) are written into
the image as ``/etc/cryobox/defaults.json`` (read by the guest agent: the default of every exec whose request
names no user or directory). The start command runs as a background process of the guest agent
(``proc_start``, tagged ``cryobox-start``) as that user, in that directory, with that environment; the bake waits
until the ready command exits 0 (run by ``/bin/sh`` as root), or — without one — until every ``EXPOSE``d TCP port
listens, or else two seconds in which it keeps running. A start command that exits fails the bake with its output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from ...errors import ImageBuildError
from ...image.recipe.model import ImageConfig, Recipe
from ...image.specs import TemplateSpec, by_name
from ..guest.client import GuestClient
from ..guest.exec import ExecSpec, run_exec
from .quiesce import listening_ports

DEFAULTS_PATH = "/etc/cryobox/defaults.json"
START_TAG = "cryobox-start"
READY_TIMEOUT_S = 300.0
SETTLE_S = 2.0


def defaults_json(config: ImageConfig) -> str:
    """The ``/etc/cryobox/defaults.json`` of an image: only what its recipe or base named."""
    body: dict[str, Any] = {"env": dict(config.env)}
    if config.workdir:
        body["workdir"] = config.workdir
    if config.user:
        body["user"] = config.user
    if config.start_cmd:
        body["start"] = config.start_cmd  # informational for the guest; the bake starts it
    if config.expose:
        body["expose"] = list(config.expose)
    return json.dumps(body, sort_keys=True)


def config_of(spec: TemplateSpec) -> ImageConfig | None:
    """The image defaults a baked recipe spec carries (:func:`baked_spec`), or ``None`` for other templates."""
    raw = spec.files.get(DEFAULTS_PATH)
    if spec.recipe is None or raw is None:
        return None
    body = json.loads(raw)
    return ImageConfig(
        env={str(k): str(v) for k, v in body.get("env", {}).items()},
        workdir=str(body.get("workdir", "")),
        user=str(body.get("user", "")),
        start_cmd=str(body.get("start", "")),
        expose=tuple(int(p) for p in body.get("expose", ())),
    )


def baked_spec(spec: TemplateSpec, config: ImageConfig) -> TemplateSpec:
    """``spec`` as baked: with the image's defaults file (so the generation covers them), booted with the agent
    disk (the guest agent never depends on what the recipe left in the image). A recipe ``FROM`` a built-in
    template (``cryobox/docker``) is baked as that template is, its files and warm-up first (``dockerd`` baked
    alive), then its own start command."""
    inherited = _builtin_base(spec)
    files = {**(inherited.files if inherited else {}), **spec.files, DEFAULTS_PATH: defaults_json(config)}
    warmup = (inherited.warmup if inherited else ()) + spec.warmup
    return dataclasses.replace(spec, files=files, warmup=warmup, agent_disk=True)


def _builtin_base(spec: TemplateSpec) -> TemplateSpec | None:
    recipe = recipe_of(spec)
    if recipe is None or recipe.base.kind != "template":
        return None
    return by_name(recipe.base.ref)


def recipe_of(spec: TemplateSpec) -> Recipe | None:
    return Recipe.from_json(spec.recipe) if spec.recipe is not None else None


async def _proc(guest: GuestClient, pid: int) -> dict[str, Any] | None:
    listed = await guest.call("proc_list", {})
    return next((p for p in listed.get("processes", []) if p.get("pid") == pid), None)


async def start_and_wait(
    guest: GuestClient,
    config: ImageConfig,
    recipe: Recipe,
    progress: Any,
    *,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """Start the image's start command and wait until it is ready; :class:`ImageBuildError` if it exits or the
    ready check does not pass within ``timeout_s``."""
    start = recipe.start_cmd or config.start_cmd
    if not start:
        return
    args: dict[str, Any] = {"cmd": "/bin/sh", "args": ["-c", start], "env": dict(config.env), "tag": START_TAG}
    if config.workdir:
        args["cwd"] = config.workdir
    if config.user:
        args["user"] = config.user
    started = await guest.call("proc_start", args)
    pid = int(started["pid"])
    progress(f"  start command running (pid {pid}): {start[:120]}")
    deadline = time.monotonic() + timeout_s
    settle_until = time.monotonic() + SETTLE_S
    while True:
        proc = await _proc(guest, pid)
        if proc is None or not proc.get("running", False):
            status = "gone" if proc is None else proc.get("status", "ended")
            raise ImageBuildError(f"the start command ended ({status}) before it was ready: {start}")
        if await _ready(guest, config, recipe, settle_until):
            progress("  start command ready")
            return
        if time.monotonic() > deadline:
            raise ImageBuildError(f"the start command was not ready after {timeout_s:.0f}s: {start}")
        await asyncio.sleep(0.5)


async def _ready(guest: GuestClient, config: ImageConfig, recipe: Recipe, settle_until: float) -> bool:
    if recipe.ready_cmd:
        result = await run_exec(guest, ExecSpec(cmd=recipe.ready_cmd, timeout_s=30.0, env=dict(config.env)))
        return result.exit_code == 0
    if config.expose:
        listening = await listening_ports(guest)
        return all(port in listening for port in config.expose)
    return time.monotonic() >= settle_until


__all__ = ["DEFAULTS_PATH", "START_TAG", "baked_spec", "config_of", "defaults_json", "recipe_of", "start_and_wait"]
