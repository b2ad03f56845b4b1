"""Templates in the fleet: rows in the registry, builds run on an agent, readiness per agent in its heartbeats.

Built-in templates are global (``workspace_id`` NULL); their rows come from the agents' registrations. A custom
template belongs to the workspace that built it and is invisible (404) to others; names are unique across the
fleet. A build runs on one agent (its progress streamed back); an agent that registers later rebuilds the
custom templates it does not serve (a content-cache hit when the bake is already on its disk). Placement sends
creates only to agents that serve the template. A build of a new name must fit the workspace's ``templates``
quota (:mod:`.quotas`; 429 ``quota_exceeded`` otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ... import models
from ...agentapi import Agent
from ...agentapi import models as am
from ...agentapi.models_templates import spec_from_request
from ...errors import BuildQueueFull, CryoboxError, HostUnavailable, InvalidArgument, NotFound, StateError
from ...image.buildpolicy import BuildAllowlist, BuildLimits
from ...objstore.keys import TEMPLATES
from ...registry import Registry, TemplateRow
from ..mapping import template_row
from .fleet import Fleet
from .ownership import StoreOwnership
from .quotas import QuotaGuard

log = logging.getLogger(__name__)
ROW_CACHE_S = 5.0
RECIPE_KEY = "build"
"""A row's ``spec`` of a recipe build: ``{"build": <BuildSpec JSON>}``; any other spec is a public request."""


def spec_name(spec: dict[str, Any]) -> str:
    """The template name a stored spec builds."""
    inner = spec.get(RECIPE_KEY)
    return str(inner["name"]) if isinstance(inner, dict) else str(spec["name"])


def build_of(spec: dict[str, Any]) -> am.TemplateBuild:
    """The build a row's stored spec asks for: a recipe's ``BuildSpec``, or the public request read into one."""
    inner = spec.get(RECIPE_KEY)
    if isinstance(inner, dict):
        return am.TemplateBuild(spec=am.BuildSpec.model_validate(inner))
    return am.TemplateBuild.of_request(spec)


class BuildWatch(Protocol):
    """Who follows one build's events and settles its outcome (a recipe build's record, :mod:`.builds`)."""

    async def event(self, event: am.BuildEvent) -> None: ...

    async def heartbeat(self) -> None:
        """Runs alongside the build (cancelled when it ends): keeps the build's record fresh."""

    async def failed(self, error: str, step: str | None) -> None: ...

    async def succeeded(self) -> None: ...


class TemplateJobs:
    def __init__(self, registry: Registry, fleet: Fleet, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.fleet = fleet
        self.clock = clock
        self.progress: dict[str, str] = {}
        self._jobs: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._rows: dict[str, tuple[float, TemplateRow]] = {}
        self.quotas: QuotaGuard | None = None
        """The workspace quotas (set by the control plane); ``None``: unlimited."""
        self.owners: StoreOwnership | None = None
        """This registry's claims in the object store (set by the control plane); ``None``: nothing claimed."""
        self.allowlist = BuildAllowlist.from_env()
        self.max_builds = BuildLimits.from_env().per_agent
        """Builds (running and queued) one control plane sends to one agent at a time."""
        self.on_deleted: Callable[[TemplateRow], Awaitable[None]] | None = None
        """Called with a custom template's row once it is deleted (the recipe builds drop its context blobs)."""

    async def _row(self, name: str) -> TemplateRow:
        cached = self._rows.get(name)
        if cached is not None and cached[0] > self.clock():
            return cached[1]
        row = await asyncio.to_thread(self.registry.get_template, name)
        self._rows[name] = (self.clock() + ROW_CACHE_S, row)
        return row

    def forget(self, name: str) -> None:
        """Drop the cached row of ``name`` (it changed)."""
        self._rows.pop(name, None)

    async def visible(self, name: str, workspace_id: str) -> TemplateRow:
        row = await self._row(name)
        if row.workspace_id is not None and row.workspace_id != workspace_id:
            raise NotFound(f"template {name!r} not found", details={"template": name})
        return row

    async def list(self, workspace_id: str) -> list[TemplateRow]:
        rows = await asyncio.to_thread(self.registry.list_templates)
        return [r for r in rows if r.workspace_id in (None, workspace_id)]

    async def require_ready(self, name: str, workspace_id: str) -> TemplateRow:
        row = await self.visible(name, workspace_id)
        if row.status != "ready":
            self.forget(name)  # a build may have finished on another replica
            row = await self.visible(name, workspace_id)
        if row.status != "ready":
            raise StateError(f"template {name!r} is {row.status}", state=row.status, required="ready")
        return row

    async def size(self, name: str) -> tuple[int, int]:
        """(vCPUs, MiB) of a template's sandboxes."""
        row = await self._row(name)
        return row.cpus, row.memory_mib

    # -- registrations ---------------------------------------------------------------------------------------

    async def agent_registered(self, name: str, agent: Agent, serving: dict[str, str]) -> None:
        """Record the built-in templates an agent serves; rebuild the custom ones it lacks there."""
        for template in await agent.templates():
            try:
                existing: TemplateRow | None = await asyncio.to_thread(self.registry.get_template, template.name)
            except NotFound:
                existing = None
            if existing is None or existing.workspace_id is None:
                await asyncio.to_thread(self.registry.upsert_template, template_row(template, None, None))
                self.forget(template.name)
        for row in await asyncio.to_thread(self.registry.list_templates):
            if row.workspace_id is None or row.spec is None or row.status == "error" or row.name in serving:
                continue
            self.launch(name, agent, row.spec, row.workspace_id, keep_status=row.status == "ready")

    # -- builds ----------------------------------------------------------------------------------------------

    async def _builder(self) -> tuple[str, Agent]:
        live = await self.fleet.live_agents()
        local = [(r.name, a) for r, a in live if r.name in self.fleet.local]
        choices = local or [(r.name, a) for r, a in live if r.status == "up"]
        if not choices:
            raise HostUnavailable("no agent is up to build the template")
        return choices[0]

    async def start_build(self, workspace_id: str, request: models.TemplateCreateRequest) -> TemplateRow:
        self.allowlist.check(spec_from_request(request))  # 400 or 403 before anything is written
        with contextlib.suppress(NotFound):
            existing = await asyncio.to_thread(self.registry.get_template, request.name)
            if existing.workspace_id != workspace_id:
                raise InvalidArgument(f"template name {request.name!r} is taken", details={"template": request.name})
            if existing.status == "building":
                raise StateError(
                    f"template {request.name!r} is already building", state="building", required="ready|error"
                )
        if self.quotas is None:
            return await self._start(workspace_id, request)
        with await self.quotas.admit_template(workspace_id, request.name):  # held until the row is written
            return await self._start(workspace_id, request)

    async def builder_with_room(self) -> tuple[str, Agent]:
        """The agent a new build goes to; ``BuildQueueFull`` (429) when it has as many as it may take."""
        agent_name, agent = await self._builder()
        running = sum(1 for builder, _ in self._jobs if builder == agent_name)
        if running >= self.max_builds:
            raise BuildQueueFull(
                f"{running} template builds are running or queued on {agent_name}; try again when one is done",
                details={"agent": agent_name, "builds": running, "limit": self.max_builds},
                retry_after_s=30.0,
            )
        return agent_name, agent

    def building(self, name: str) -> bool:
        """Whether this control plane runs a build of ``name`` (on any agent)."""
        return any(key[1] == name for key in self._jobs)

    async def _start(self, workspace_id: str, request: models.TemplateCreateRequest) -> TemplateRow:
        agent_name, agent = await self.builder_with_room()
        spec = spec_from_request(request)
        row = TemplateRow(
            name=request.name,
            generation="",
            cpus=spec.cpus,
            memory_mib=spec.memory_mib,
            status="building",
            path="",
            created_at=time.time(),
            workspace_id=workspace_id,
            spec=request.model_dump(),
        )
        await asyncio.to_thread(self.registry.upsert_template, row)
        self.forget(request.name)
        self.launch(agent_name, agent, request.model_dump(), workspace_id, keep_status=False)
        return row

    def launch(
        self,
        agent_name: str,
        agent: Agent,
        spec: dict[str, Any],
        workspace_id: str,
        *,
        keep_status: bool,
        watch: BuildWatch | None = None,
    ) -> None:
        """Build ``spec`` (as a row stores it) on ``agent`` in the background; ``watch`` follows it."""
        name = spec_name(spec)
        key = (agent_name, name)
        if key in self._jobs:
            return
        if not keep_status:
            self.progress[name] = "queued"
        task = asyncio.get_running_loop().create_task(
            self._build(agent_name, agent, spec, workspace_id, keep_status, watch), name=f"template-{name}@{agent_name}"
        )
        self._jobs[key] = task
        task.add_done_callback(lambda _: self._jobs.pop(key, None))

    async def _build(
        self,
        agent_name: str,
        agent: Agent,
        spec: dict[str, Any],
        workspace_id: str,
        keep_status: bool,
        watch: BuildWatch | None = None,
    ) -> None:
        beat = asyncio.create_task(watch.heartbeat(), name="build-heartbeat") if watch is not None else None
        try:
            await self._run(agent_name, agent, spec, workspace_id, keep_status, watch)
        finally:
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(BaseException):
                    await beat

    async def _run(
        self,
        agent_name: str,
        agent: Agent,
        spec: dict[str, Any],
        workspace_id: str,
        keep_status: bool,
        watch: BuildWatch | None,
    ) -> None:
        name = spec_name(spec)
        error: str | None = None
        step: str | None = None
        built: am.TemplateInfo | None = None
        try:
            if self.owners is not None:  # the agent publishes what it builds: the template is this registry's
                await asyncio.to_thread(self.owners.claim, f"{TEMPLATES}/{name}")
            # the stored spec (a recipe's BuildSpec, or the public request read into one) is what the agent builds
            async for event in agent.build_template(build_of(spec)):
                if event.progress and not keep_status:
                    self.progress[name] = event.progress[:200]
                if event.error is not None:
                    error, step = event.error, event.step
                if event.template is not None:
                    built = event.template
                if watch is not None:
                    await watch.event(event)
        except CryoboxError as err:
            error = err.message
        if built is None:
            log.warning("template %s failed to build: %s", name, error)
            if watch is not None:
                await watch.failed(error or "build failed", step)
            elif not keep_status:
                with contextlib.suppress(NotFound):
                    await asyncio.to_thread(
                        self.registry.update_template_status, name, "error", (error or "build failed")[:4000]
                    )
            self.forget(name)
            return
        # placement reads what agents serve from their rows: record it now, or a create right after "ready"
        # would be refused until the agent's next heartbeat
        try:
            await self.fleet.refresh_capacity(agent_name, agent)
        except CryoboxError as err:
            log.warning("template %s: could not refresh %s's capacity: %s", name, agent_name, err.message)
        with contextlib.suppress(NotFound):
            current = await asyncio.to_thread(self.registry.get_template, name)
            stored = spec if watch is not None else current.spec  # a recipe build's spec replaces the old one
            await asyncio.to_thread(self.registry.upsert_template, template_row(built, workspace_id, stored))
        self.forget(name)
        self.progress[name] = "ready"
        if watch is not None:
            await watch.succeeded()

    async def delete(self, name: str, workspace_id: str) -> None:
        row = await self.visible(name, workspace_id)
        if row.workspace_id is None:
            raise StateError(f"template {name!r} is built in and cannot be deleted", state="builtin", required="custom")
        for key in [k for k in self._jobs if k[1] == name]:
            job = self._jobs.pop(key)
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
        for agent_row, agent in await self.fleet.live_agents():
            try:
                await agent.remove_template(name)
            except CryoboxError as err:
                log.warning("removing template %s on %s failed: %s", name, agent_row.name, err.message)
        await asyncio.to_thread(self.registry.delete_template, name)
        self.forget(name)
        self.progress.pop(name, None)
        if self.on_deleted is not None:
            await self.on_deleted(row)

    async def close(self) -> None:
        for job in list(self._jobs.values()):
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
