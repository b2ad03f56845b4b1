"""Fork, fork-tree, promote, and the in-place lifecycle actions (pause/resume/hibernate/wake)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response

from ...agentapi import models as am
from ...errors import CryoboxError, NotFound
from .. import wire
from ..mapping import sandbox_view
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/sandboxes", tags=["forks"], responses=ERROR_RESPONSES)


@router.post("/{sandbox_id}/fork", status_code=201, response_model=wire.ForkResponse)
async def fork(
    sandbox_id: str, body: Annotated[wire.ForkRequest, Body(default_factory=wire.ForkRequest)], ctx: Ctx
) -> wire.ForkResponse:
    """A child that cold-boots from a copy of the parent's disk (fresh processes, no memory)."""
    row = await ctx.app.forks.fork(sandbox_id, ctx.workspace_id, metadata=body.metadata)
    return wire.ForkResponse(parent_id=sandbox_id, sandbox=sandbox_view(row))


@router.post("/{sandbox_id}/fork-tree", status_code=201, response_model=wire.ForkTreeResponse)
async def fork_tree(
    sandbox_id: str, body: Annotated[wire.ForkTreeRequest, Body(default_factory=wire.ForkTreeRequest)], ctx: Ctx
) -> wire.ForkTreeResponse:
    """One snapshot of the parent, ``count`` children restored from it in parallel (memory and disk), on the
    parent's agent where it has room and on others otherwise."""
    tree = await ctx.app.forks.fork_tree(sandbox_id, ctx.workspace_id, count=body.count, metadata=body.metadata)
    return wire.ForkTreeResponse(
        tree_id=tree.tree_id,
        parent_id=sandbox_id,
        snapshot_id=tree.snapshot.id,
        children=[sandbox_view(row) for row in tree.children],
        errors=[wire.ForkTreeError(index=i, error=e) for i, e in tree.errors],
    )


@router.post("/{sandbox_id}/promote", response_model=wire.PromoteResponse)
async def promote(sandbox_id: str, body: wire.PromoteRequest, ctx: Ctx) -> wire.PromoteResponse:
    """Keep ``sandbox_id`` as the winner of its fork tree; with ``cleanup_siblings`` delete the others."""
    winner = await ctx.control.row(sandbox_id, ctx.workspace_id)
    if winner.metadata.get("cryobox.tree_id") != body.tree_id:
        raise NotFound(
            f"sandbox {winner.id} is not a child of tree {body.tree_id}",
            details={"id": winner.id, "tree_id": body.tree_id},
        )
    deleted: list[str] = []
    failures: list[wire.PromoteFailure] = []
    if body.cleanup_siblings:
        for sibling in await ctx.app.forks.tree_members(body.tree_id, ctx.workspace_id):
            if sibling.id == winner.id:
                continue
            try:
                await ctx.control.delete(sibling.id, ctx.workspace_id)
                deleted.append(sibling.id)
            except CryoboxError as err:
                failures.append(wire.PromoteFailure(id=sibling.id, error=err.message))
    return wire.PromoteResponse(winner=winner.id, tree_id=body.tree_id, deleted=deleted, failures=failures)


async def _act(ctx: Ctx, sandbox_id: str, action: str) -> am.SandboxInfo:
    if action == "hibernate":  # inside the workspace's quota of hibernated sandboxes
        return await ctx.control.hibernate(sandbox_id, ctx.workspace_id)
    # resume and wake bring a hibernated sandbox back (inside the workspace's quota), whatever its auto_wake
    wake = action in ("resume", "wake")
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id, wake=wake, explicit=wake)
    info: am.SandboxInfo = await getattr(agent, action)(sandbox_id)
    await ctx.control.record_state(sandbox_id, info)
    return info


@router.post("/{sandbox_id}/pause", status_code=204, response_class=Response)
async def pause(sandbox_id: str, ctx: Ctx) -> Response:
    """Freeze the vCPUs in place."""
    await _act(ctx, sandbox_id, "pause")
    return Response(status_code=204)


@router.post("/{sandbox_id}/resume", status_code=204, response_class=Response)
async def resume(sandbox_id: str, ctx: Ctx) -> Response:
    """Continue a paused sandbox (the guest clock is stepped to the host's first)."""
    await _act(ctx, sandbox_id, "resume")
    return Response(status_code=204)


@router.post("/{sandbox_id}/hibernate", response_model=wire.StatusResponse)
async def hibernate(sandbox_id: str, ctx: Ctx) -> wire.StatusResponse:
    """Capture to disk and stop QEMU; any later request to the sandbox wakes it (unless its ``auto_wake`` is
    false: then only ``resume``/``wake`` do). Kept for the server's paused retention; 429 past the workspace's
    ``hibernated`` quota."""
    return wire.StatusResponse(status=(await _act(ctx, sandbox_id, "hibernate")).state)


@router.post("/{sandbox_id}/wake", response_model=wire.StatusResponse)
async def wake(sandbox_id: str, ctx: Ctx) -> wire.StatusResponse:
    return wire.StatusResponse(status=(await _act(ctx, sandbox_id, "wake")).state)
