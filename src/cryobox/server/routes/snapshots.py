"""Snapshot routes: take one of a running sandbox, list/get/patch/delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request, Response

from .. import wire
from ..mapping import snapshot_view
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["snapshots"], responses=ERROR_RESPONSES)


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, response_model=wire.Snapshot)
async def create_snapshot(
    sandbox_id: str,
    body: Annotated[wire.SnapshotCreateRequest, Body(default_factory=wire.SnapshotCreateRequest)],
    ctx: Ctx,
) -> wire.Snapshot:
    """Snapshot memory, device state and disk while the sandbox keeps running (it pauses for ``pause_ms``)."""
    row = await ctx.control.snapshots.take(
        sandbox_id, ctx.workspace_id, labels=body.labels, retain=body.retain, quiesce=body.quiesce
    )
    return snapshot_view(row)


@router.post("/snapshots/import", status_code=201, response_model=wire.Snapshot)
async def import_snapshot(body: wire.SnapshotImportRequest, ctx: Ctx) -> wire.Snapshot:
    """Register a snapshot another installation published to this server's object store; restores of it page
    its memory in from the store. Retained by default (it has no sandbox here)."""
    row = await ctx.control.snapshots.import_published(
        body.id, ctx.workspace_id, labels=body.labels, retain=body.retain
    )
    return snapshot_view(row)


@router.post("/snapshots/{snapshot_id}/publish", response_model=wire.SnapshotPublished)
async def publish_snapshot(snapshot_id: str, ctx: Ctx) -> wire.SnapshotPublished:
    """Make sure the snapshot is in the object store (every snapshot is copied there after its capture; this
    waits for it), e.g. before another installation sharing the store imports it."""
    return wire.SnapshotPublished(**await ctx.control.snapshots.publish(snapshot_id, ctx.workspace_id))


@router.get("/snapshots", response_model=wire.SnapshotList)
async def list_snapshots(request: Request, ctx: Ctx, sandbox_id: str | None = None) -> wire.SnapshotList:
    labels = {k[len("label.") :]: v for k, v in request.query_params.items() if k.startswith("label.")}
    rows = await ctx.control.snapshots.list_rows(ctx.workspace_id, sandbox_id, labels)
    return wire.SnapshotList(snapshots=[snapshot_view(r) for r in rows])


@router.get("/snapshots/{snapshot_id}", response_model=wire.Snapshot)
async def get_snapshot(snapshot_id: str, ctx: Ctx) -> wire.Snapshot:
    return snapshot_view(await ctx.control.snapshots.get(snapshot_id, ctx.workspace_id))


@router.patch("/snapshots/{snapshot_id}", response_model=wire.Snapshot)
async def patch_snapshot(snapshot_id: str, body: wire.SnapshotPatch, ctx: Ctx) -> wire.Snapshot:
    row = await ctx.control.snapshots.update(snapshot_id, ctx.workspace_id, labels=body.labels, retain=body.retain)
    return snapshot_view(row)


@router.delete("/snapshots/{snapshot_id}", status_code=204, response_class=Response)
async def delete_snapshot(snapshot_id: str, ctx: Ctx) -> Response:
    await ctx.control.snapshots.delete(snapshot_id, ctx.workspace_id)
    return Response(status_code=204)


@router.get("/snapshots/{snapshot_id}/evidence", response_model=wire.EvidenceList)
async def list_evidence(snapshot_id: str, ctx: Ctx) -> wire.EvidenceList:
    """ext: files kept beside the snapshot (the VM's console and QEMU logs, plus what clients added)."""
    files = await ctx.control.snapshots.evidence_list(snapshot_id, ctx.workspace_id)
    return wire.EvidenceList.model_validate({"files": files})


@router.get(
    "/snapshots/{snapshot_id}/evidence/{name}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "the file"}},
)
async def get_evidence(snapshot_id: str, name: str, ctx: Ctx) -> Response:
    data = await ctx.control.snapshots.evidence_read(snapshot_id, ctx.workspace_id, name)
    return Response(content=data, media_type="application/octet-stream")


@router.put("/snapshots/{snapshot_id}/evidence/{name}", response_model=wire.EvidenceFile)
async def put_evidence(snapshot_id: str, name: str, request: Request, ctx: Ctx) -> wire.EvidenceFile:
    """ext: store a file beside the snapshot (raw body, at most 64 MiB), e.g. a failing test's log."""
    size = await ctx.control.snapshots.evidence_put(snapshot_id, ctx.workspace_id, name, await request.body())
    return wire.EvidenceFile(name=name, size=size)
