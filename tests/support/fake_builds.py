"""The recipe builds of :class:`~.fake_agent.FakeAgent`: step logs on its clock, a failure at a chosen step, the
context blobs (and image archives) fetched from its object store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

from cryobox.agentapi import models as m
from cryobox.errors import CryoboxError
from cryobox.objstore import keys
from cryobox.objstore.client import ObjectStore


class FakeRecipeBuilds:
    """Mixed into ``FakeAgent`` (whose ``objects``, ``clock``, ``template_infos`` and ids it uses)."""

    objects: ObjectStore
    clock: Callable[[], float]
    template_infos: dict[str, m.TemplateInfo]
    _ids: itertools.count[int]

    def _init_builds(self) -> None:
        self.recipe_fail_step: str | None = None
        """A recipe build fails at this step (``"base"``, ``"1"``.., ``"finalize"``)."""
        self.recipe_log_lines = 1
        """Log lines a recipe build prints per step."""
        self.build_contexts: dict[str, bytes] = {}
        """Context blobs (and image archives) recipe builds fetched from ``objects``, by SHA-256."""
        self.build_gate: asyncio.Event | None = None
        """When set, a recipe build waits for it after its first step's logs."""

    async def _recipe_build(self, spec: m.BuildSpec) -> AsyncIterator[m.BuildEvent]:
        """A recipe build: ``base``, each step, ``finalize`` (``recipe_log_lines`` lines each, on ``clock``), then
        the template, or an error at ``recipe_fail_step``; COPY contexts and an archive base are fetched from
        ``objects``."""
        recipe = spec.recipe or {}
        base = recipe.get("base", {})
        phases: list[tuple[str, str]] = [("base", f"FROM {base.get('kind')} {base.get('ref')}")]
        for index, step in enumerate(recipe.get("steps", ()), start=1):
            phases.append((str(index), f"{step['op']} {' '.join(step.get('args', ()))}"))
        phases.append(("finalize", f"start: {recipe.get('start_cmd', '')}"))
        if base.get("kind") == "archive":
            try:
                self.build_contexts[base["ref"]] = self.objects.get(keys.build_context(base["ref"]))
            except CryoboxError as err:
                yield m.BuildEvent(error=f"image archive: {err.message}", step="base")
                return
        for index, step in enumerate(recipe.get("steps", ()), start=1):
            if step.get("context"):
                try:
                    self.build_contexts[step["context"]] = self.objects.get(keys.build_context(step["context"]))
                except CryoboxError as err:
                    yield m.BuildEvent(error=f"context of step {index}: {err.message}", step=str(index))
                    return
        for number, (phase, text) in enumerate(phases):
            for line in range(self.recipe_log_lines):
                yield m.BuildEvent(log=f"{text} [{line}]", step=phase, level="info")
            if number == 0 and self.build_gate is not None:
                await self.build_gate.wait()
            await asyncio.sleep(0)
            if phase == self.recipe_fail_step:
                yield m.BuildEvent(error=f"step {phase} failed: exit status 1", step=phase)
                return
        info = m.TemplateInfo(
            name=spec.name,
            generation=f"g{next(self._ids)}",
            cpus=spec.cpus,
            memory_mib=spec.memory_mib,
            created_at=self.clock(),
        )
        self.template_infos[spec.name] = info
        yield m.BuildEvent(template=info)
