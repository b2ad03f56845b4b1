"""Recipe builds of custom templates: context blobs in the object store, build records and their logs in the
registry, the build itself through :class:`~.templates.TemplateJobs` (same quotas, allowlist, per-agent bound).

The front doors (E2B's template API, Dockerfile builds) read their requests into a
:class:`~cryobox.image.recipe.model.Recipe` and call :meth:`RecipeBuilds.start_recipe_build`; the template row
stores the recipe's :class:`~cryobox.agentapi.models_templates.BuildSpec` (``{"build": …}``), so an agent that
registers later rebuilds it like any custom template. A failed *first* build of a name leaves no template (the row
is deleted, the build record keeps the error); a failed *rebuild* leaves the previous ready template serving.
Deleting a template deletes the context blobs no other template's spec names. A build whose control plane stopped
(its record's heartbeat stale) is failed as interrupted wherever its record is read here (:mod:`.buildwatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...agentapi import models as am
from ...errors import InvalidArgument, NotFound, PayloadTooLarge, StateError, StoreError
from ...image.recipe.model import Recipe
from ...objstore import keys
from ...objstore.client import ObjectStore
from ...objstore.manifests import delete_published
from ...registry import Registry, TemplateRow
from ...registry.builds import ACTIVE, BuildLogEntry, BuildRecord, BuildRecords
from .buildwatch import HEARTBEAT_S, STALE_AFTER_S, RecordWatch, settle_stale
from .templates import RECIPE_KEY, TemplateJobs

log = logging.getLogger(__name__)

MAX_CONTEXT_ENV = "CRYOBOX_BUILD_CONTEXT_MAX_BYTES"
DEFAULT_MAX_CONTEXT_BYTES = 256 << 20
MAX_ARCHIVE_ENV = "CRYOBOX_BUILD_ARCHIVE_MAX_BYTES"
DEFAULT_MAX_ARCHIVE_BYTES = 4 << 30
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
"""What a template name may be (that of ``POST /v1/templates``)."""
CPU_RANGE = (1, 8)
MEMORY_RANGE = (256, 16384)


def _max_bytes(env: Mapping[str, str] | None, var: str, default: int) -> int:
    raw = (env if env is not None else os.environ).get(var, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise InvalidArgument(f"{var} must be a number of bytes, not {raw!r}") from None
    if value <= 0:
        raise InvalidArgument(f"{var} must be positive, not {raw!r}")
    return value


def max_context_bytes(env: Mapping[str, str] | None = None) -> int:
    return _max_bytes(env, MAX_CONTEXT_ENV, DEFAULT_MAX_CONTEXT_BYTES)


def max_archive_bytes(env: Mapping[str, str] | None = None) -> int:
    """The largest image archive (``docker save``, OCI layout tar) a build may upload."""
    return _max_bytes(env, MAX_ARCHIVE_ENV, DEFAULT_MAX_ARCHIVE_BYTES)


def _in_range(field: str, value: int | None, bounds: tuple[int, int], default: int) -> int:
    if value is None:
        return default
    if not bounds[0] <= value <= bounds[1]:
        raise InvalidArgument(f"{field} must be {bounds[0]}..{bounds[1]}, not {value}", details={"field": field})
    return value


def _checked(name: str, cpus: int | None, memory_mib: int | None) -> tuple[int, int]:
    if not NAME.fullmatch(name):
        raise InvalidArgument(
            f"template name {name!r}: 1-63 of a-z, 0-9 and '-', starting with a letter or digit",
            details={"field": "name", "template": name},
        )
    return _in_range("cpus", cpus, CPU_RANGE, 1), _in_range("memory_mib", memory_mib, MEMORY_RANGE, 512)


def recipe_contexts(spec: dict[str, Any] | None) -> set[str]:
    """The blobs (context blobs, an image archive) a stored spec (a row's or a build's) names."""
    inner = (spec or {}).get(RECIPE_KEY)
    if not isinstance(inner, dict) or not isinstance(inner.get("recipe"), dict):
        return set()
    return set(Recipe.from_json(inner["recipe"]).blobs())


class RecipeBuilds:
    """``ctx.control.builds``: the service every front door's template builds go through."""

    def __init__(
        self,
        registry: Registry,
        templates: TemplateJobs,
        objects: ObjectStore | None,
        *,
        clock: Callable[[], float] = time.time,
        max_bytes: int | None = None,
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_s: float = HEARTBEAT_S,
        max_archive: int | None = None,
    ) -> None:
        self.registry = registry
        self.templates = templates
        self.objects = objects
        self.clock = clock
        self.records = BuildRecords(registry.database)
        self.max_context_bytes = max_bytes if max_bytes is not None else max_context_bytes()
        self.stale_after_s = stale_after_s
        """A started build whose record was not refreshed for this long lost its control plane."""
        self.heartbeat_s = heartbeat_s
        """How often the control plane running a build refreshes its record (well under :attr:`stale_after_s`)."""
        self.max_archive_bytes = max_archive if max_archive is not None else max_archive_bytes()
        templates.on_deleted = self._deleted

    def _store(self) -> ObjectStore:
        if self.objects is None:
            raise StateError(
                "template recipes need an object store (CRYOBOX_OBJECT_STORE)", state="no_store", required="store"
            )
        return self.objects

    # -- context blobs ---------------------------------------------------------------------------------------

    async def put_context(self, workspace_id: str, data: bytes) -> str:
        """Store a context blob (a gzip'd tar) under ``keys.build_context(sha256(data))``; returns the hash.
        :raises PayloadTooLarge: over the limit (nothing stored)."""
        if len(data) > self.max_context_bytes:
            raise PayloadTooLarge(
                f"build context of {len(data)} bytes exceeds {self.max_context_bytes}",
                details={"limit": self.max_context_bytes, "workspace_id": workspace_id},
            )
        store = self._store()
        digest = hashlib.sha256(data).hexdigest()
        key = keys.build_context(digest)
        if not await asyncio.to_thread(store.exists, key):
            await asyncio.to_thread(store.put, key, bytes(data))
        return digest

    async def put_archive(self, workspace_id: str, path: Path, sha256: str) -> None:
        """Store an image archive (``path``, whose SHA-256 is ``sha256``) under ``keys.build_context(sha256)``,
        streamed from the file. :raises PayloadTooLarge: over :attr:`max_archive_bytes` (nothing stored)."""
        size = path.stat().st_size
        if size > self.max_archive_bytes:
            raise PayloadTooLarge(
                f"image archive of {size} bytes exceeds {self.max_archive_bytes}",
                details={"field": "image_archive", "limit": self.max_archive_bytes, "workspace_id": workspace_id},
            )
        store = self._store()
        key = keys.build_context(sha256)
        if not await asyncio.to_thread(store.exists, key):
            await asyncio.to_thread(store.put_file, key, path)

    @staticmethod
    def check_order(name: str, cpus: int | None, memory_mib: int | None) -> None:
        """What :meth:`start_recipe_build` refuses of a build's name and size (400), before anything is stored."""
        _checked(name, cpus, memory_mib)

    async def has_context(self, sha256: str) -> bool:
        return await asyncio.to_thread(self._store().exists, keys.build_context(sha256))

    async def record_file(self, workspace_id: str, files_hash: str, blob_sha256: str, template: str) -> None:
        """Remember that ``files_hash`` (a client's own hash of its files) is blob ``blob_sha256`` here."""
        await asyncio.to_thread(self.records.record_file, workspace_id, files_hash, blob_sha256, template, self.clock())

    async def file_blob(self, workspace_id: str, files_hash: str) -> str | None:
        """The blob uploaded for ``files_hash`` in this workspace whose object is still stored, if any."""
        blob = await asyncio.to_thread(self.records.file_blob, workspace_id, files_hash)
        if blob is None or not await self.has_context(blob):
            return None
        return blob

    # -- builds ----------------------------------------------------------------------------------------------

    async def start_recipe_build(
        self,
        workspace_id: str,
        *,
        name: str,
        recipe: Recipe,
        cpus: int | None,
        memory_mib: int | None,
        tags: Sequence[str] = (),
        build_id: str | None = None,
    ) -> BuildRecord:
        """Start building ``recipe`` as template ``name``. Refusals write nothing: 400 (bad name, size or a
        context blob not in the store), 403 (allowlist), 409 (the name is building), 429 (quota, builder full)."""
        cpu, memory = _checked(name, cpus, memory_mib)
        reserved = await self._reserved(workspace_id, name, build_id)
        for blob in recipe.blobs():
            if not await self.has_context(blob):
                raise InvalidArgument(f"build context {blob} was never uploaded", details={"hash": blob})
        spec = am.BuildSpec(name=name, cpus=cpu, memory_mib=memory, packages=(), recipe=recipe.to_json())
        self.templates.allowlist.check(spec.template_spec())
        build_id = build_id or str(uuid.uuid4())
        history = await self.builds_of(workspace_id, name)  # settles a build whose control plane stopped first
        latest = history[-1] if history else None
        existing = await self._existing(workspace_id, name)
        if self.templates.building(name) or (existing is not None and existing.status == "building"):
            raise StateError(f"template {name!r} is already building", state="building", required="ready|error")
        if latest is not None and latest.status in ACTIVE and latest.spec is not None and latest.build_id != build_id:
            raise StateError(f"template {name!r} is already building", state=latest.status, required="ready|error")
        quotas = self.templates.quotas
        admission = await quotas.admit_template(workspace_id, name) if quotas is not None else None
        with admission if admission is not None else contextlib.nullcontext():  # held until the rows are written
            agent_name, agent = await self.templates.builder_with_room()
            record = BuildRecord(
                build_id=build_id,
                template=name,
                workspace_id=workspace_id,
                status="waiting",
                created_at=max(self.clock(), latest.created_at + 1e-3) if latest is not None else self.clock(),
                tags=tuple(tags) or ("default",),
                cpus=cpu,
                memory_mib=memory,
                spec=spec.model_dump(mode="json"),
            )
            if reserved is None:
                await asyncio.to_thread(self.records.add, record)
            else:
                record = await asyncio.to_thread(
                    self.records.update,
                    build_id,
                    tags=record.tags,
                    cpus=cpu,
                    memory_mib=memory,
                    spec=record.spec,
                    updated_at=self.clock(),
                )
            stored = {RECIPE_KEY: spec.model_dump(mode="json")}
            first = existing is None or existing.status != "ready"
            if first:
                row = TemplateRow(
                    name=name,
                    generation="",
                    cpus=cpu,
                    memory_mib=memory,
                    status="building",
                    path="",
                    created_at=self.clock(),
                    workspace_id=workspace_id,
                    spec=stored,
                )
                await asyncio.to_thread(self.registry.upsert_template, row)
                self.templates.forget(name)
        watch = RecordWatch(self, record, first=first)
        self.templates.launch(agent_name, agent, stored, workspace_id, keep_status=not first, watch=watch)
        return record

    async def reserve_build(
        self, workspace_id: str, *, name: str, cpus: int | None, memory_mib: int | None, tags: Sequence[str] = ()
    ) -> BuildRecord:
        """A build id for a build whose recipe comes later (E2B's ``POST /v3/templates``): a ``waiting`` record
        without a spec, which :meth:`start_recipe_build` with that ``build_id`` takes over. Checks what it can
        now (name, size, whether the name is another workspace's)."""
        cpu, memory = _checked(name, cpus, memory_mib)
        await self._existing(workspace_id, name)
        record = BuildRecord(
            build_id=str(uuid.uuid4()),
            template=name,
            workspace_id=workspace_id,
            status="waiting",
            created_at=self.clock(),
            tags=tuple(tags) or ("default",),
            cpus=cpu,
            memory_mib=memory,
        )
        await asyncio.to_thread(self.records.add, record)
        return record

    async def _reserved(self, workspace_id: str, name: str, build_id: str | None) -> BuildRecord | None:
        """The reservation ``build_id`` names, if it is one (409 if the id is a started build or another's)."""
        if build_id is None:
            return None
        try:
            record = await asyncio.to_thread(self.records.get, build_id, workspace_id)
        except NotFound:
            return None
        if record.template != name or record.spec is not None or record.status != "waiting":
            raise StateError(
                f"build {build_id} was already started",
                state=record.status,
                required="waiting",
                details={"build_id": build_id},
            )
        return record

    async def _existing(self, workspace_id: str, name: str) -> TemplateRow | None:
        try:
            row = await asyncio.to_thread(self.registry.get_template, name)
        except NotFound:
            return None
        if row.workspace_id != workspace_id:
            raise InvalidArgument(f"template name {name!r} is taken", details={"template": name})
        return row

    async def build(self, workspace_id: str, build_id: str) -> BuildRecord:
        return await settle_stale(self, await asyncio.to_thread(self.records.get, build_id, workspace_id))

    async def build_logs(
        self, workspace_id: str, build_id: str, offset: int, limit: int, level: str | None = None
    ) -> list[BuildLogEntry]:
        await self.build(workspace_id, build_id)  # 404 across workspaces
        return await asyncio.to_thread(self.records.logs, build_id, max(0, offset), max(0, limit), level)

    async def build_logs_by_time(
        self,
        workspace_id: str,
        build_id: str,
        *,
        cursor: float | None,
        newest_first: bool,
        limit: int,
        min_level: str | None = None,
    ) -> list[BuildLogEntry]:
        """Lines by time (:meth:`~cryobox.registry.builds.BuildRecords.logs_by_time`); 404 across workspaces."""
        await self.build(workspace_id, build_id)
        return await asyncio.to_thread(
            self.records.logs_by_time,
            build_id,
            cursor=cursor,
            newest_first=newest_first,
            limit=max(0, limit),
            min_level=min_level,
        )

    async def latest_build(self, workspace_id: str, name: str) -> BuildRecord | None:
        builds = await self.builds_of(workspace_id, name)
        return builds[-1] if builds else None

    async def recent_builds(self, workspace_id: str, limit: int) -> list[BuildRecord]:
        """The workspace's builds of every template, newest first."""
        return [await settle_stale(self, r) for r in await asyncio.to_thread(self.records.recent, workspace_id, limit)]

    async def builds_of(self, workspace_id: str, name: str) -> list[BuildRecord]:
        """The template's builds in this workspace, oldest first."""
        builds = await asyncio.to_thread(self.records.of_template, workspace_id, name)
        return [await settle_stale(self, r) for r in builds]

    async def settle_workspace(self, workspace_id: str) -> None:
        """Fail the workspace's builds whose control plane stopped (before listing its templates)."""
        for record in await asyncio.to_thread(self.records.active, workspace_id):
            await settle_stale(self, record)

    # -- tags ------------------------------------------------------------------------------------------------

    async def assign_tags(self, workspace_id: str, name: str, source: str, tags: Sequence[str]) -> BuildRecord:
        """Give ``tags`` to the build of ``name`` tagged ``source`` (taken from any other build of it)."""
        builds = await self.builds_of(workspace_id, name)
        target = next((b for b in reversed(builds) if source in b.tags and b.status == "ready"), None)
        if target is None:
            raise NotFound(f"template {name!r} has no ready build tagged {source!r}", details={"tag": source})
        for build in builds:
            if build.build_id != target.build_id and set(tags) & set(build.tags):
                kept = tuple(t for t in build.tags if t not in tags)
                await asyncio.to_thread(self.records.update, build.build_id, tags=kept)
        merged = tuple(dict.fromkeys([*target.tags, *tags]))
        return await asyncio.to_thread(self.records.update, target.build_id, tags=merged)

    async def remove_tags(self, workspace_id: str, name: str, tags: Sequence[str]) -> None:
        builds = await self.builds_of(workspace_id, name)
        if not builds:
            raise NotFound(f"template {name!r} not found", details={"template": name})
        for build in builds:
            if set(tags) & set(build.tags):
                kept = tuple(t for t in build.tags if t not in tags)
                await asyncio.to_thread(self.records.update, build.build_id, tags=kept)

    # -- deletion --------------------------------------------------------------------------------------------

    async def _deleted(self, row: TemplateRow) -> None:
        """Drop what a deleted template left in the store: its published generations (unless a snapshot taken from
        it still needs them to restore on another host; the chunks go with ``cryobox gc --store``) and the context
        blobs no remaining template's spec names."""
        if self.objects is not None:
            snapshots = await asyncio.to_thread(self.registry.list_snapshots)
            if not any(snapshot.template == row.name for snapshot in snapshots):
                try:
                    await asyncio.to_thread(delete_published, self.objects, f"{keys.TEMPLATES}/{row.name}/")
                except StoreError as err:
                    log.warning("could not delete the published template %s: %s", row.name, err.message)
                else:
                    if self.templates.owners is not None:
                        await asyncio.to_thread(self.templates.owners.release, f"{keys.TEMPLATES}/{row.name}")
        mine = recipe_contexts(row.spec)
        if row.workspace_id is not None:
            for build in await self.builds_of(row.workspace_id, row.name):
                mine |= recipe_contexts(build.spec)
        if not mine or self.objects is None:
            return
        for other in await asyncio.to_thread(self.registry.list_templates):
            mine -= recipe_contexts(other.spec)
        for blob in sorted(mine):
            try:
                await asyncio.to_thread(self.objects.delete, keys.build_context(blob))
            except StoreError as err:
                log.warning("could not delete build context %s: %s", blob, err.message)
        await asyncio.to_thread(self.records.forget_blobs, sorted(mine))


__all__ = [
    "ACTIVE",
    "BuildLogEntry",
    "BuildRecord",
    "RecipeBuilds",
    "max_archive_bytes",
    "max_context_bytes",
    "recipe_contexts",
]
