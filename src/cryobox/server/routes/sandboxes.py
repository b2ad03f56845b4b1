"""Sandbox lifecycle and command routes."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import StreamingResponse

from ... import models
from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError, SandboxTimeout
from ...registry import HIBERNATED
from ...util.steps import call_timing, step
from ...util.times import rfc3339
from ..control.createrequest import INHERIT, CreateRequest
from ..control.sandboxes import UNSET
from ..control.timeouts import OnTimeout
from ..control.volumes import MountRequest
from ..execlog import ExecRecord
from ..mapping import sandbox_view
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"], responses=ERROR_RESPONSES)


@router.post("", status_code=201, response_model=models.Sandbox)
async def create_sandbox(
    body: Annotated[models.CreateSandboxRequest, Body(default_factory=models.CreateSandboxRequest)],
    ctx: Ctx,
    response: Response,
) -> models.Sandbox:
    """Restore a sandbox on an agent with room. ``Server-Timing`` says how the call's time split between the
    control plane (``control``: auth, placement, registry) and the agent (``agent``: the restore itself)."""
    started = time.monotonic()
    timing: dict[str, float] = {}
    # validated (and a legacy shape translated) before anything is created; none given: nothing allowed, or the
    # snapshot's recorded policy
    egress = body.network if body.network is not None else INHERIT
    row, mounts = await ctx.control.create_mounted(
        CreateRequest(
            template=body.template,
            workspace_id=ctx.workspace_id,
            metadata=body.metadata,
            env=body.env,
            ttl_s=body.ttl_seconds,
            persistent=body.persistent,
            from_snapshot=body.from_snapshot,
            egress=egress,
            on_timeout=OnTimeout(body.on_timeout, body.auto_wake),
            volumes=None
            if body.volumes is None
            else tuple(MountRequest(v.name, v.mount_path, v.read_only) for v in body.volumes),
        ),
        timing,
    )
    view = sandbox_view(row)
    if body.volumes or body.from_snapshot is not None:  # mounts asked for, or a snapshot's re-attached
        view.volumes = [models.SandboxVolume(name=m.name, path=m.path, read_only=m.read_only) for m in mounts]
    response.headers["Server-Timing"] = call_timing(started, timing)
    return view


@router.get("", response_model=models.SandboxList)
async def list_sandboxes(request: Request, ctx: Ctx, status: models.SandboxStatus | None = None) -> models.SandboxList:
    wanted = {k[len("metadata.") :]: v for k, v in request.query_params.items() if k.startswith("metadata.")}
    rows = await ctx.control.list_rows(ctx.workspace_id, status, wanted)
    return models.SandboxList(items=[sandbox_view(r) for r in rows])


@router.get("/{sandbox_id}", response_model=models.Sandbox)
async def get_sandbox(sandbox_id: str, ctx: Ctx) -> models.Sandbox:
    return await _with_volumes(ctx, sandbox_view(await ctx.control.get(sandbox_id, ctx.workspace_id)))


async def _with_volumes(ctx: Ctx, view: models.Sandbox) -> models.Sandbox:
    """The view with the sandbox's mounts (one registry read)."""
    mounts = await ctx.control.volumes.mounts_of(view.id)
    view.volumes = [models.SandboxVolume(name=name, path=path, read_only=ro) for name, path, ro in mounts]
    return view


@router.delete("/{sandbox_id}", status_code=204, response_class=Response)
async def delete_sandbox(sandbox_id: str, ctx: Ctx, keep_snapshots: bool = False) -> Response:
    """Delete the sandbox and its snapshots, except ``retain`` ones (or all of them with ``keep_snapshots``),
    which become orphans: deleted by the sweep once the grace period (default 7 days) has passed."""
    await ctx.control.delete(sandbox_id, ctx.workspace_id, keep_snapshots=keep_snapshots)
    return Response(status_code=204)


@router.get("/{sandbox_id}/net")
async def inspect_net(sandbox_id: str, ctx: Ctx) -> dict[str, Any]:
    """ext: the guest's sockets, neighbour table, resolver config, interfaces, wall and monotonic clocks and
    instance id (``cryobox inspect net``): compare one taken before a snapshot with one after a restore."""
    net = await (await ctx.control.agent_for(sandbox_id, ctx.workspace_id)).inspect_net(sandbox_id)
    return net.model_dump(mode="json")


async def _lifecycle(ctx: Ctx, info: am.SandboxInfo) -> models.Lifecycle:
    row = await ctx.control.row(info.id, ctx.workspace_id)
    hibernated_at = row.hibernated_at if info.state == HIBERNATED else None
    retained = hibernated_at + ctx.control.timeouts.retention_s if hibernated_at is not None else None
    return models.Lifecycle(
        ttl_seconds=info.ttl_s,
        persistent=info.persistent,
        idle_seconds=info.idle_s,
        expires_at=rfc3339(info.expires_at) if info.expires_at is not None else None,
        on_timeout=row.on_timeout,  # type: ignore[arg-type]  # checked when written
        auto_wake=row.auto_wake,
        hibernated_at=rfc3339(hibernated_at) if hibernated_at is not None else None,
        retained_until=rfc3339(retained) if retained is not None else None,
    )


@router.get("/{sandbox_id}/lifecycle", response_model=models.Lifecycle)
async def get_lifecycle(sandbox_id: str, ctx: Ctx) -> models.Lifecycle:
    """The TTL clock, the timeout action, whether requests wake it, and (hibernated) until when it is kept."""
    return await _lifecycle(ctx, await ctx.control.lifecycle(sandbox_id, ctx.workspace_id))


@router.patch("/{sandbox_id}/lifecycle", response_model=models.Lifecycle)
async def patch_lifecycle(sandbox_id: str, body: models.LifecyclePatch, ctx: Ctx) -> models.Lifecycle:
    ttl = body.ttl_seconds if "ttl_seconds" in body.model_fields_set else UNSET
    info = await ctx.control.update_lifecycle(
        sandbox_id,
        ctx.workspace_id,
        ttl_s=ttl,
        persistent=body.persistent,
        on_timeout=body.on_timeout,
        auto_wake=body.auto_wake,
    )
    return await _lifecycle(ctx, info)


def exec_spec(body: models.ExecRequest) -> am.ExecRequest:
    stdin = base64.b64encode(body.stdin.encode()).decode() if body.stdin is not None else None
    return am.ExecRequest(cmd=body.cmd, timeout_s=body.timeout_seconds, env=body.env, cwd=body.cwd, stdin_b64=stdin)


def _timeout_message(body: models.ExecRequest) -> str:
    return f"command timed out after {body.timeout_seconds}s (timeout_seconds reached; process group killed)"


@router.post("/{sandbox_id}/exec", response_model=models.ExecResponse)
async def exec_command(sandbox_id: str, body: models.ExecRequest, ctx: Ctx, response: Response) -> models.ExecResponse:
    """Run a command to its end. ``Server-Timing`` splits the call: ``control`` (routing, the record), ``agent``
    (the agent's call, the guest's included: after a restart, waiting for the sandbox's adoption too) and
    ``guest`` (the command itself, as the guest timed it)."""
    started = time.monotonic()
    started_at = time.time()
    timing: dict[str, float] = {}
    try:
        spec = exec_spec(body)

        async def call(agent: Agent) -> am.ExecResult:
            with step(timing, "agent"):
                return await agent.exec(sandbox_id, spec)

        result = await ctx.control.fleet.on_guest(sandbox_id, ctx.workspace_id, call)
    except CryoboxError:
        ctx.app.metrics.observe_exec("error", time.monotonic() - started)
        raise
    ctx.app.metrics.observe_exec("timeout" if result.timed_out else "ok", time.monotonic() - started)
    ctx.app.execs.record(
        sandbox_id,
        ExecRecord(
            command=body.cmd,
            exit_code=None if result.timed_out else result.exit_code,
            started_at=started_at,
            duration_ms=result.duration_ms,
            stdout_tail=result.stdout,
            stderr_tail=result.stderr,
            timed_out=result.timed_out,
        ),
    )
    response.headers["Server-Timing"] = call_timing(started, timing, guest=result.duration_ms)
    if result.timed_out:
        raise SandboxTimeout(
            _timeout_message(body),
            details={
                "stdout": result.stdout,
                "stderr": result.stderr,
                "exit_code": result.exit_code,
                "timeout_seconds": body.timeout_seconds,
            },
        )
    return models.ExecResponse(
        stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code, duration_ms=result.duration_ms
    )


def _sse(event: str, data: dict[str, object]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@router.post(
    "/{sandbox_id}/exec/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
)
async def exec_stream(sandbox_id: str, body: models.ExecRequest, ctx: Ctx) -> StreamingResponse:
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)  # plain 404/409 errors, not a stream
    stream = agent.exec_stream(sandbox_id, exec_spec(body))
    try:  # an error before the first event (a paused sandbox, a refused command) is a plain error response
        first = await anext(aiter(stream))
    except StopAsyncIteration:
        first = None

    async def items() -> AsyncIterator[am.ExecEvent]:
        if first is None:
            return
        yield first
        async for event in stream:
            yield event

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in items():
                if event.kind == "exit" and event.result is not None:
                    if event.result.timed_out:
                        yield _sse("error", {"error": _timeout_message(body), "code": "timeout"})
                    else:
                        yield _sse("exit", {"exit_code": event.result.exit_code})
                    return
                yield _sse(event.kind, {"chunk": event.text})
        except CryoboxError as err:
            yield _sse("error", {"error": err.message, "code": err.code})

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
