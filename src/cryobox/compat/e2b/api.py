"""The E2B control-plane API under ``/e2b``: what the pinned ``e2b`` SDK calls, on the same control plane as
``/v1``.

- create (``POST /sandboxes``, ``/v2/sandboxes``): ``templateID`` names a template (``base``,
  ``code-interpreter-v1`` is ``code-interpreter``) or a snapshot (by id or by the name it was taken with), which
  is then restored; ``timeout`` is the sandbox's TTL (default 300 s), ``metadata`` and ``envVars`` as on ``/v1``;
  ``allow_internet_access`` and ``network`` become the sandbox's network policy (:mod:`.network`; a create that
  says nothing gets the operator's ``CRYOBOX_E2B_INTERNET``, or from a snapshot the snapshot's policy).
- ``PUT /sandboxes/{id}/network`` (``update_network``) replaces the egress rules of a sandbox, running or paused.
- pause is a hibernation (memory and disk to the host's disk, QEMU stopped: a paused sandbox costs no RAM, as in
  E2B) and connect (``/v2/sandboxes/{id}/connect``) or resume wakes it; a sandbox frozen with ``/v1`` pause
  reads ``paused`` too and connect resumes it.
- fork (``count``) is a fork tree: one capture, ``count`` restores; one result (sandbox or error) per child.
- snapshots are cryobox snapshots kept past their sandbox (``retain``) and labelled ``e2b.name``; E2B deletes
  them as templates (``DELETE /templates/{id}``).
- timeout and refreshes set the TTL (cryobox's TTL counts from the last activity).
"""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from ...errors import InvalidArgument, NotFound, StateError
from ...registry import ON_TIMEOUT_HIBERNATE, ON_TIMEOUT_KILL, SandboxRow, SnapshotRow
from ...server.control.createrequest import INHERIT, CreateRequest
from ...server.control.timeouts import OnTimeout
from ...server.control.volumes import MountRequest
from ...server.routes.deps import Caller
from .access import SandboxAccess
from .network import UPDATE_KEYS, E2BSettings, default_policy, to_policy
from .network import refuse_unenforced as refuse_network
from .paging import page_offset, page_token
from .routing import E2BCtx, E2BRoute
from .tags import DEFAULT_TAG, split_name, tagged_template
from .views import (
    DEFAULT_TIMEOUT_S,
    PAUSED_STATES,
    SNAPSHOT_NAME_LABEL,
    TEMPLATE_ALIASES,
    ConnectBody,
    ForkBody,
    NewSandbox,
    RefreshBody,
    SnapshotBody,
    TimeoutBody,
    detail,
    error,
    listed,
    sandbox,
    snapshot_info,
)

router = APIRouter(prefix="/e2b", route_class=E2BRoute, include_in_schema=False)
MAX_PAGE = 1000


def _token(ctx: Caller, sandbox_id: str) -> str:
    return SandboxAccess(ctx.control, ctx.app.limiter).token(sandbox_id)


def _sandbox(ctx: Caller, row: SandboxRow) -> dict[str, Any]:
    access = SandboxAccess(ctx.control, ctx.app.limiter)
    return sandbox(row, access.token(row.id), access.traffic_token(row.id), ctx.app.sandbox_domain)


async def _snapshot_named(ctx: Caller, name: str) -> SnapshotRow | None:
    try:
        return await ctx.control.snapshots.get(name, ctx.workspace_id)
    except NotFound:
        pass
    rows = await ctx.control.snapshots.list_rows(ctx.workspace_id, None, {SNAPSHOT_NAME_LABEL: name})
    return max(rows, key=lambda r: r.created_at) if rows else None


def settings(request: Request) -> E2BSettings:
    """The front door's settings, read when the app was built (``app.state.e2b``)."""
    found = getattr(request.app.state, "e2b", None)
    return found if isinstance(found, E2BSettings) else E2BSettings()


Settings = Annotated[E2BSettings, Depends(settings)]


async def _create(ctx: Caller, body: NewSandbox, e2b: E2BSettings) -> JSONResponse:
    template = TEMPLATE_ALIASES.get(body.template_id, body.template_id)
    from_snapshot: str | None = None
    if template not in TEMPLATE_ALIASES.values():
        snapshot = await _snapshot_named(ctx, body.template_id)
        if snapshot is not None:
            from_snapshot, template = snapshot.id, snapshot.template
        elif ":" in template:  # name:tag (:mod:`.tags`)
            name, tag = split_name(template)
            builds = await ctx.control.builds.builds_of(ctx.workspace_id, name)
            template = TEMPLATE_ALIASES.get(name, tagged_template(name, tag or DEFAULT_TAG, builds))
    asked = to_policy(body.allow_internet_access, body.network, e2b)
    egress = asked if asked is not None else INHERIT if from_snapshot is not None else default_policy(e2b)
    row = await ctx.control.create(
        CreateRequest(
            template=template,
            workspace_id=ctx.workspace_id,
            metadata=body.metadata or {},
            env=body.env_vars or {},
            ttl_s=body.timeout if body.timeout is not None else DEFAULT_TIMEOUT_S,
            persistent=False,
            from_snapshot=from_snapshot,
            egress=egress,
            on_timeout=OnTimeout(
                ON_TIMEOUT_HIBERNATE if body.auto_pause else ON_TIMEOUT_KILL,
                auto_wake=body.auto_resume is not None and body.auto_resume.enabled,  # E2B: only connect resumes
            ),
            volumes=tuple(MountRequest(m.name, m.path) for m in body.volume_mounts) or None,
        )
    )
    return JSONResponse(_sandbox(ctx, row), status_code=201)


@router.post("/sandboxes")
async def create_v1(body: NewSandbox, ctx: E2BCtx, e2b: Settings) -> JSONResponse:
    return await _create(ctx, body, e2b)


@router.post("/v2/sandboxes")
async def create_v2(body: NewSandbox, ctx: E2BCtx, e2b: Settings) -> JSONResponse:
    return await _create(ctx, body, e2b)


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(
    sandbox_id: str, ctx: E2BCtx, e2b: Settings, body: Annotated[dict[str, Any], Body(default_factory=dict)]
) -> Response:
    """``update_network``: the new egress rules replace the old ones (a field left out is cleared; saying nothing
    about the internet is the operator's default); the ports' public access and host mask stay."""
    refuse_network(body, UPDATE_KEYS, "network")
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise InvalidArgument("allow_internet_access must be a boolean", details={"field": "allow_internet_access"})
    current = await ctx.control.network.policy(sandbox_id, ctx.workspace_id)  # 404: the SDK's "sandbox not found"
    policy = to_policy(internet, body, e2b, keep=current) or default_policy(e2b)
    await ctx.control.set_network(sandbox_id, ctx.workspace_id, policy)
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, ctx: E2BCtx) -> dict[str, Any]:
    row = await ctx.control.get(sandbox_id, ctx.workspace_id)
    if row.status not in ("running", "starting", *PAUSED_STATES):
        raise NotFound(f"sandbox {sandbox_id} is {row.status}", details={"sandbox_id": sandbox_id})
    mounts = await ctx.control.volumes.mounts_of(row.id)
    return detail(row, _token(ctx, row.id), ctx.app.sandbox_domain, [{"name": n, "path": p} for n, p, _ in mounts])


def _metadata_query(text: str | None) -> dict[str, str]:
    """``metadata=user%3Dabc%26app%3Dprod`` (keys and values URL-encoded, then the whole query encoded)."""
    if not text:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError as err:
        raise InvalidArgument(f"metadata query {text!r} is not key=value pairs") from err
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


async def _visible(ctx: Caller, metadata: str | None, states: set[str]) -> list[SandboxRow]:
    rows = await ctx.control.list_rows(ctx.workspace_id, None, _metadata_query(metadata))
    wanted = []
    for row in rows:
        state = "paused" if row.status in PAUSED_STATES else "running" if row.status == "running" else None
        if state is not None and state in states:
            wanted.append(row)
    return wanted


@router.get("/sandboxes")
async def list_v1(ctx: E2BCtx, metadata: str | None = None) -> list[dict[str, Any]]:
    return [listed(r) for r in sorted(await _visible(ctx, metadata, {"running"}), key=lambda r: -r.created_at)]


@router.get("/v2/sandboxes")
async def list_v2(
    request: Request,
    response: Response,
    ctx: E2BCtx,
    metadata: str | None = None,
    order: str = "desc",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> list[dict[str, Any]]:
    states: set[str] = set()
    for value in request.query_params.getlist("state"):
        states.update(s.strip() for s in value.split(",") if s.strip())
    unknown = states - {"running", "paused"}
    if unknown:
        raise InvalidArgument(f"unknown state(s) {sorted(unknown)}: running or paused")
    rows = await _visible(ctx, metadata, states or {"running", "paused"})
    rows.sort(key=lambda r: (r.created_at, r.id), reverse=order != "asc")
    start = page_offset(next_token)
    page = rows[start : start + limit]
    if start + limit < len(rows):
        response.headers["X-Next-Token"] = page_token(start + limit)
    response.headers["X-Total-Running"] = str(sum(1 for r in rows if r.status == "running"))
    return [listed(r) for r in page]


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, ctx: E2BCtx) -> Response:
    await ctx.control.delete(sandbox_id, ctx.workspace_id)
    return Response(status_code=204)


async def _set_ttl(ctx: Caller, sandbox_id: str, seconds: int) -> None:
    await ctx.control.update_lifecycle(sandbox_id, ctx.workspace_id, ttl_s=seconds, persistent=None)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, body: TimeoutBody, ctx: E2BCtx) -> Response:
    await _set_ttl(ctx, sandbox_id, body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
async def refresh(
    sandbox_id: str, ctx: E2BCtx, body: Annotated[RefreshBody, Body(default_factory=RefreshBody)]
) -> Response:
    if body.duration is not None:
        await _set_ttl(ctx, sandbox_id, body.duration)
    else:
        await (await ctx.control.agent_for(sandbox_id, ctx.workspace_id, wake=False)).touch(sandbox_id)
    return Response(status_code=204)


async def _wake(ctx: Caller, sandbox_id: str, timeout: int | None) -> tuple[SandboxRow, bool]:
    """Bring a paused or hibernated sandbox back; returns its row and whether it had to be woken."""
    row = await ctx.control.get(sandbox_id, ctx.workspace_id)
    if row.status not in ("running", "starting", *PAUSED_STATES):
        raise NotFound(f"sandbox {sandbox_id} is {row.status}", details={"sandbox_id": sandbox_id})
    woke = row.status in PAUSED_STATES
    # a hibernated one wakes here: connect is an explicit resume, whatever autoResume says
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id, wake=True, explicit=True)
    if row.status == "paused":
        await ctx.control.record_state(sandbox_id, await agent.resume(sandbox_id))
    if timeout is not None:
        info = await agent.get(sandbox_id)
        if info.expires_at is None or info.ttl_s is None or info.ttl_s < timeout:  # connect only extends
            await _set_ttl(ctx, sandbox_id, timeout)
    return await ctx.control.get(sandbox_id, ctx.workspace_id), woke


async def _connect(ctx: Caller, sandbox_id: str, body: ConnectBody) -> JSONResponse:
    row, woke = await _wake(ctx, sandbox_id, body.timeout)
    return JSONResponse(_sandbox(ctx, row), status_code=201 if woke else 200)


@router.post("/sandboxes/{sandbox_id}/connect")
async def connect_v1(
    sandbox_id: str, ctx: E2BCtx, body: Annotated[ConnectBody, Body(default_factory=ConnectBody)]
) -> JSONResponse:
    return await _connect(ctx, sandbox_id, body)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect_v2(
    sandbox_id: str, ctx: E2BCtx, body: Annotated[ConnectBody, Body(default_factory=ConnectBody)]
) -> JSONResponse:
    return await _connect(ctx, sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/resume")
async def resume(
    sandbox_id: str, ctx: E2BCtx, body: Annotated[ConnectBody, Body(default_factory=ConnectBody)]
) -> JSONResponse:
    row = await ctx.control.get(sandbox_id, ctx.workspace_id)
    if row.status not in PAUSED_STATES:
        raise StateError(f"sandbox {sandbox_id} is not paused", state=row.status, required="paused")
    return await _connect(ctx, sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(sandbox_id: str, ctx: E2BCtx) -> Response:
    row = await ctx.control.get(sandbox_id, ctx.workspace_id)
    if row.status in PAUSED_STATES:
        raise StateError(f"sandbox {sandbox_id} is already paused", state=row.status, required="running")
    await ctx.control.hibernate(sandbox_id, ctx.workspace_id)  # 429 past the workspace's hibernated quota
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork(
    sandbox_id: str, ctx: E2BCtx, body: Annotated[ForkBody, Body(default_factory=ForkBody)]
) -> list[dict[str, Any]]:
    parent = await ctx.control.get(sandbox_id, ctx.workspace_id)
    outcome = await ctx.app.forks.fork_tree(sandbox_id, ctx.workspace_id, count=body.count, metadata=parent.metadata)
    results: list[dict[str, Any] | None] = [None] * body.count
    for index, message in outcome.errors:
        results[index] = {"error": error(503, message)}
    children = iter(outcome.children)
    for index in range(body.count):
        if results[index] is None:
            child = next(children, None)
            if child is None:
                results[index] = {"error": error(500, "fork did not start")}
                continue
            if body.timeout is not None:
                await _set_ttl(ctx, child.id, body.timeout)
            results[index] = {"sandbox": _sandbox(ctx, child)}
    return [r for r in results if r is not None]


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create_snapshot(
    sandbox_id: str, ctx: E2BCtx, body: Annotated[SnapshotBody, Body(default_factory=SnapshotBody)]
) -> dict[str, Any]:
    labels = {SNAPSHOT_NAME_LABEL: body.name} if body.name else {}
    row = await ctx.control.snapshots.take(sandbox_id, ctx.workspace_id, labels=labels, retain=True, quiesce=False)
    return snapshot_info(row)


@router.get("/snapshots")
async def list_snapshots(
    response: Response,
    ctx: E2BCtx,
    sandbox_id: Annotated[str | None, Query(alias="sandboxID")] = None,
    name: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> list[dict[str, Any]]:
    rows = await ctx.control.snapshots.list_rows(ctx.workspace_id, sandbox_id, {})
    if name:
        rows = [r for r in rows if name in (r.id, r.labels.get(SNAPSHOT_NAME_LABEL))]
    rows.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    start = page_offset(next_token)
    if start + limit < len(rows):
        response.headers["X-Next-Token"] = page_token(start + limit)
    return [snapshot_info(r) for r in rows[start : start + limit]]


@router.delete("/templates/{template_id}", status_code=204)
async def delete_template(template_id: str, ctx: E2BCtx) -> Response:
    """E2B deletes snapshots as templates, and templates (a custom template of the workspace, by name)."""
    snapshot = await _snapshot_named(ctx, template_id)
    if snapshot is None:
        await ctx.control.templates.delete(template_id.partition(":")[0], ctx.workspace_id)
        return Response(status_code=204)
    await ctx.control.snapshots.delete(snapshot.id, ctx.workspace_id)
    return Response(status_code=204)


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def unserved(rest: str, request: Request, ctx: E2BCtx) -> Response:
    """Anything else of E2B's API (volumes, teams, …): a 404 in E2B's shape."""
    raise NotFound(f"cryobox serves no E2B route {request.method} /{rest}", details={"path": rest})
