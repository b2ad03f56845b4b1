"""Fork, fork-tree, promote, and the in-place lifecycle actions (pause/resume/hibernate/wake)."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response

from ..errors import CryoboxError
from . import wire
from .deps import Ctx
from .errors import ERROR_RESPONSES
from .views import sandbox_view

router = APIRouter(prefix="/v1/sandboxes", tags=["forks"], responses=ERROR_RESPONSES)


@router.post("/{sandbox_id}/fork", status_code=201, response_model=wire.ForkResponse)
async def fork(sandbox_id: str, body: wire.ForkRequest, ctx: Ctx) -> wire.ForkResponse:
    """A child that cold-boots from a copy of the parent's disk (fresh processes, no memory)."""
    await ctx.control.get(sandbox_id, ctx.workspace_id)
    async with ctx.control.admission.slot():
        child = await ctx.control.snapshots.forking.fork(sandbox_id, ctx.workspace_id, metadata=body.metadata)
    row = await ctx.control.record(child)
    return wire.ForkResponse(parent_id=sandbox_id, sandbox=sandbox_view(row))


@router.post("/{sandbox_id}/fork-tree", status_code=201, response_model=wire.ForkTreeResponse)
async def fork_tree(sandbox_id: str, body: wire.ForkTreeRequest, ctx: Ctx) -> wire.ForkTreeResponse:
    """One snapshot of the parent, ``count`` children restored from it in parallel (memory and disk)."""
    await ctx.control.get(sandbox_id, ctx.workspace_id)
    tree, snapshot = await ctx.control.snapshots.fork_tree(
        sandbox_id, ctx.workspace_id, count=body.count, metadata=body.metadata
    )
    children = []
    errors = [wire.ForkTreeError(index=i, error=e) for i, e in tree.errors]
    for index, child in enumerate(tree.children):
        try:
            children.append(sandbox_view(await ctx.control.record(child)))
        except CryoboxError as err:
            errors.append(wire.ForkTreeError(index=len(tree.errors) + index, error=err.message))
    return wire.ForkTreeResponse(
        tree_id=tree.tree_id, parent_id=sandbox_id, snapshot_id=snapshot.id, children=children, errors=errors
    )


@router.post("/{sandbox_id}/promote", response_model=wire.PromoteResponse)
async def promote(sandbox_id: str, body: wire.PromoteRequest, ctx: Ctx) -> wire.PromoteResponse:
    """Keep ``sandbox_id`` as the winner of its fork tree; with ``cleanup_siblings`` delete the others."""
    snapshots = ctx.control.snapshots
    winner = ctx.service.get(sandbox_id, ctx.workspace_id)
    snapshots.require_member(winner, body.tree_id)
    deleted: list[str] = []
    failures: list[wire.PromoteFailure] = []
    if body.cleanup_siblings:
        for sibling in snapshots.tree_members(body.tree_id, ctx.workspace_id):
            if sibling.id == winner.id:
                continue
            try:
                await ctx.control.delete(sibling.id, ctx.workspace_id)
                deleted.append(sibling.id)
            except CryoboxError as err:
                failures.append(wire.PromoteFailure(id=sibling.id, error=err.message))
    return wire.PromoteResponse(winner=winner.id, tree_id=body.tree_id, deleted=deleted, failures=failures)


@router.post("/{sandbox_id}/pause", status_code=204, response_class=Response)
async def pause(sandbox_id: str, ctx: Ctx) -> Response:
    """Freeze the vCPUs in place."""
    await ctx.control.set_status(await ctx.service.pause(sandbox_id, ctx.workspace_id))
    return Response(status_code=204)


@router.post("/{sandbox_id}/resume", status_code=204, response_class=Response)
async def resume(sandbox_id: str, ctx: Ctx) -> Response:
    """Continue a paused sandbox (the guest clock is stepped to the host's first)."""
    await ctx.control.set_status(await ctx.service.resume(sandbox_id, ctx.workspace_id))
    return Response(status_code=204)


@router.post("/{sandbox_id}/hibernate", response_model=wire.StatusResponse)
async def hibernate(sandbox_id: str, ctx: Ctx) -> wire.StatusResponse:
    """Capture to disk and stop QEMU; any later request to the sandbox wakes it."""
    sandbox = await ctx.service.hibernate(sandbox_id, ctx.workspace_id)
    with contextlib.suppress(CryoboxError):
        await ctx.control.set_status(sandbox)
    return wire.StatusResponse(status=sandbox.state.value)


@router.post("/{sandbox_id}/wake", response_model=wire.StatusResponse)
async def wake(sandbox_id: str, ctx: Ctx) -> wire.StatusResponse:
    sandbox = await ctx.service.wake(sandbox_id, ctx.workspace_id)
    await ctx.control.set_status(sandbox)
    return wire.StatusResponse(status=sandbox.state.value)
