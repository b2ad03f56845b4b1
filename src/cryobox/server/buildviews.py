"""Recipe builds as the public API shows them (:class:`~cryobox.models.builds.TemplateBuild`, log lines) and a build's
log followed live (:func:`follow`), shared by cryobox's routes, PandaStack's and the console's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from .. import models
from ..image.recipe.model import Recipe
from ..registry.builds import BuildLogEntry, BuildRecord
from ..util.times import rfc3339
from .control.builds import RecipeBuilds

STATUS: dict[str, models.BuildStatus] = {
    "waiting": "queued",
    "building": "building",
    "ready": "done",
    "error": "failed",
}
"""A build record's status on the wire (PandaStack's words: its SDK waits for ``done`` or ``failed``)."""
TERMINAL = frozenset({"ready", "error"})
PAGE = 500
POLL_S = 0.25
KEEPALIVE_S = 15.0


def recipe_of(record: BuildRecord) -> Recipe | None:
    inner: Any = (record.spec or {}).get("recipe")
    return Recipe.from_json(inner) if isinstance(inner, dict) else None


def _failed_step(record: BuildRecord, recipe: Recipe | None) -> models.FailedStep | None:
    if record.status != "error":
        return None
    step = record.error_step or ""
    if recipe is not None and step == "base":
        base = recipe.base
        source = f"archive {base.name or base.ref[:12]}" if base.kind == "archive" else base.ref
        return models.FailedStep(step=step, instruction=f"FROM {source}")
    if recipe is not None and step.isdigit() and 1 <= int(step) <= len(recipe.steps):
        found = recipe.steps[int(step) - 1]
        text = " ".join(found.args[1:] if found.op == "RUN" and found.args[:1] == ("exec",) else found.args)
        return models.FailedStep(step=step, line=found.line or None, instruction=f"{found.op} {text}")
    return models.FailedStep(step=step or "unknown")


def build_view(record: BuildRecord) -> models.TemplateBuild:
    recipe = recipe_of(record)
    image = recipe is not None and recipe.base.kind == "image" and not recipe.steps
    return models.TemplateBuild(
        id=record.build_id,
        name=record.template,
        status=STATUS.get(record.status, "building"),
        error=record.error,
        failed_step=_failed_step(record, recipe),
        started_at=rfc3339(record.created_at),
        ended_at=rfc3339(record.finished_at) if record.finished_at is not None else None,
        cpu=record.cpus,
        memory_mb=record.memory_mib,
        image_ref=recipe.base.ref if image and recipe is not None else None,
        steps_total=len(recipe.steps) + 2 if recipe is not None else 0,
        logs_url=f"/v1/templates/{record.template}/builds/{record.build_id}/logs",
    )


def log_line(entry: BuildLogEntry) -> models.BuildLogLine:
    return models.BuildLogLine(
        offset=entry.offset,
        timestamp=rfc3339(entry.timestamp),
        level=entry.level,
        step=entry.step,
        message=entry.message,
    )


async def follow(
    builds: RecipeBuilds, workspace_id: str, build_id: str, offset: int = 0, *, poll_s: float = POLL_S
) -> AsyncIterator[BuildLogEntry | BuildRecord | None]:
    """A build's log lines from ``offset`` as they are written, then its final record (last). ``None`` is yielded
    after every :data:`KEEPALIVE_S` without a line (a stream sends a keepalive). The status is read before each
    page, so the lines of a finished build are all out before its record."""
    idle = 0.0
    while True:
        record = await builds.build(workspace_id, build_id)
        lines = await builds.build_logs(workspace_id, build_id, offset, PAGE)
        for entry in lines:
            yield entry
        if lines:
            offset = lines[-1].offset + 1
            idle = 0.0
            continue
        if record.status in TERMINAL:
            yield record
            return
        await asyncio.sleep(poll_s)
        idle += poll_s
        if idle >= KEEPALIVE_S:
            idle = 0.0
            yield None


__all__ = ["STATUS", "TERMINAL", "build_view", "follow", "log_line", "recipe_of"]
