"""Custom templates: build jobs (images + bake) run in the background; the registry records their state.

Built-in templates are global (``workspace_id`` NULL); a custom template belongs to the workspace that built
it and is invisible (404) to others. Names are unique across the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import models
from ..agent.service import SandboxService
from ..agent.templates import Template
from ..errors import InvalidArgument, NotFound, StateError
from ..image.specs import TemplateSpec, by_name, derived_spec
from ..registry import Registry, TemplateRow
from ..util.proc import Progress

log = logging.getLogger(__name__)
TemplatePreparer = Callable[[TemplateSpec, Progress], Awaitable[Template]]


def spec_from_request(request: models.TemplateCreateRequest) -> TemplateSpec:
    base = by_name(request.base)
    if base is None:  # pragma: no cover - the request model only admits built-in names
        raise InvalidArgument(f"unknown base template {request.base!r}")
    return derived_spec(
        request.name,
        base,
        packages=tuple(request.packages),
        pip=tuple(request.pip),
        files=dict(request.files),
        warmup=tuple(request.warmup),
        cpus=request.cpu,
        memory_mib=request.memory_mb,
    )


def row_for_template(template: Template, workspace_id: str | None, spec: dict[str, Any] | None) -> TemplateRow:
    return TemplateRow(
        name=template.name,
        generation=template.generation,
        cpu=template.machine.cpus,
        memory_mb=template.machine.memory_mib,
        status="ready",
        path=str(template.path),
        created_at=template.created_at,
        workspace_id=workspace_id,
        spec=spec,
    )


class TemplateJobs:
    def __init__(self, service: SandboxService, registry: Registry, preparer: TemplatePreparer | None) -> None:
        self.service = service
        self.registry = registry
        self.preparer = preparer
        self.progress: dict[str, str] = {}
        self._jobs: dict[str, asyncio.Task[None]] = {}

    async def visible(self, name: str, workspace_id: str) -> TemplateRow:
        row = await asyncio.to_thread(self.registry.get_template, name)
        if row.workspace_id is not None and row.workspace_id != workspace_id:
            raise NotFound(f"template {name!r} not found", details={"template": name})
        return row

    async def list(self, workspace_id: str) -> list[TemplateRow]:
        rows = await asyncio.to_thread(self.registry.list_templates)
        return [r for r in rows if r.workspace_id in (None, workspace_id)]

    async def require_ready(self, name: str, workspace_id: str) -> None:
        row = await self.visible(name, workspace_id)
        if row.status != "ready" or name not in self.service.templates:
            raise StateError(f"template {name!r} is {row.status}", state=row.status, required="ready")

    async def start_build(self, workspace_id: str, request: models.TemplateCreateRequest) -> TemplateRow:
        if self.preparer is None:
            raise StateError("this server cannot build templates", state="disabled", required="enabled")
        spec = spec_from_request(request)
        with contextlib.suppress(NotFound):
            existing = await asyncio.to_thread(self.registry.get_template, request.name)
            if existing.workspace_id != workspace_id:
                raise InvalidArgument(f"template name {request.name!r} is taken", details={"template": request.name})
            if existing.status == "building":
                raise StateError(
                    f"template {request.name!r} is already building", state="building", required="ready|error"
                )
        row = TemplateRow(
            name=spec.name,
            generation="",
            cpu=spec.cpus,
            memory_mb=spec.memory_mib,
            status="building",
            path="",
            created_at=time.time(),
            workspace_id=workspace_id,
            spec=request.model_dump(),
        )
        await asyncio.to_thread(self.registry.upsert_template, row)
        self._launch(spec, workspace_id, request.model_dump())
        return row

    def _launch(self, spec: TemplateSpec, workspace_id: str, spec_json: dict[str, Any]) -> None:
        self.progress[spec.name] = "queued"
        task = asyncio.create_task(self._build(spec, workspace_id, spec_json), name=f"template-{spec.name}")
        self._jobs[spec.name] = task
        task.add_done_callback(lambda _: self._jobs.pop(spec.name, None))

    async def _build(self, spec: TemplateSpec, workspace_id: str, spec_json: dict[str, Any]) -> None:
        assert self.preparer is not None

        def progress(line: str) -> None:
            self.progress[spec.name] = line[:200]

        try:
            template = await self.preparer(spec, progress)
        except Exception as err:  # a failed build is a template state, reported through the API
            log.warning("template %s failed to build: %s", spec.name, err)
            with contextlib.suppress(NotFound):
                await asyncio.to_thread(self.registry.update_template_status, spec.name, "error", str(err)[:4000])
            return
        self.service.add_template(template)
        await asyncio.to_thread(self.registry.upsert_template, row_for_template(template, workspace_id, spec_json))
        self.progress[spec.name] = "ready"

    async def resume_builds(self) -> None:
        """After a restart: bring custom templates back (a cache hit when their bake still exists)."""
        for row in await asyncio.to_thread(self.registry.list_templates):
            if row.workspace_id is None or row.spec is None or row.status == "error":
                continue
            request = models.TemplateCreateRequest.model_validate(row.spec)
            if self.preparer is not None:
                self._launch(spec_from_request(request), row.workspace_id, row.spec)

    async def delete(self, name: str, workspace_id: str) -> None:
        row = await self.visible(name, workspace_id)
        if row.workspace_id is None:
            raise StateError(f"template {name!r} is built in and cannot be deleted", state="builtin", required="custom")
        job = self._jobs.pop(name, None)
        if job is not None:
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
        await self.service.remove_template(name)
        await asyncio.to_thread(self.registry.delete_template, name)
        self.progress.pop(name, None)

    async def close(self) -> None:
        for job in list(self._jobs.values()):
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
