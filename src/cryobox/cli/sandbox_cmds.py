"""``cryobox sandbox ...`` and ``cryobox template ...``: the API from the shell (through the SDK)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..errors import CryoboxError
from ._common import (
    ApiKey,
    ApiUrl,
    Json,
    connected,
    err,
    fail,
    out,
    parse_pairs,
    print_json,
    sandbox_table,
    snapshot_json,
)
from .lifecycle_cmds import AutoWakeOpt, OnTimeoutOpt
from .network_cmds import AllowOpt, DefaultOpt, DenyOpt, MaskOpt, PortOpt, PublicOpt, policy_from_options

if TYPE_CHECKING:
    from .. import models

sandbox_app = typer.Typer(help="Create, inspect, use and delete sandboxes.", no_args_is_help=True)
template_app = typer.Typer(help="Templates.", no_args_is_help=True)

Metadata = Annotated[list[str] | None, typer.Option("--metadata", "-m", help="KEY=VALUE (repeatable)")]


@sandbox_app.command("create")
def create(
    template: Annotated[str, typer.Option(help="template name")] = "code-interpreter",
    from_snapshot: Annotated[
        str | None, typer.Option("--from-snapshot", help="restore this snapshot instead of the template")
    ] = None,
    ttl: Annotated[int | None, typer.Option("--ttl", help="idle TTL in seconds")] = None,
    on_timeout: OnTimeoutOpt = None,
    auto_wake: AutoWakeOpt = None,
    metadata: Metadata = None,
    default: DefaultOpt = None,
    allow: AllowOpt = None,
    deny: DenyOpt = None,
    port: PortOpt = None,
    public_traffic: PublicOpt = None,
    mask_host: MaskOpt = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Create a sandbox (a restore of the template's snapshot, or of --from-snapshot) and print its id.

    With any network option the sandbox starts with that network policy (options not given take their defaults:
    --default deny, no rules, any port); without one, the server's default. Change it later with `network`.
    """
    from ..sdk.sandbox import Sandbox

    what = f"snapshot {from_snapshot}" if from_snapshot else f"a {template} sandbox"
    try:
        with err.status(f"restoring {what}"):
            sbx = Sandbox.create(
                template=template,
                from_snapshot=from_snapshot,
                ttl_seconds=ttl,
                on_timeout=on_timeout.value if on_timeout is not None else None,
                auto_wake=auto_wake,
                metadata=parse_pairs(metadata),
                network=policy_from_options(default, allow, deny, port, public_traffic, mask_host),
                api_url=api_url,
                api_key=api_key,
            )
        sbx.close()
    except CryoboxError as error:
        fail(error)
    if as_json:
        print_json(sbx.info.model_dump())
    else:
        out.print(sbx.id)
        err.print(f"{sbx.info.boot_mode} in {sbx.info.boot_ms:.0f} ms")


@sandbox_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List sandboxes."""
    from ..sdk.sandbox import Sandbox

    try:
        items = Sandbox.list(api_url=api_url, api_key=api_key)
    except CryoboxError as error:
        fail(error)
    if as_json:
        print_json([s.model_dump() for s in items])
    else:
        out.print(sandbox_table(items))


@sandbox_app.command("get")
def get(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Show one sandbox."""
    with connected(sandbox_id, api_url, api_key) as sbx:
        pass
    if as_json:
        print_json(sbx.info.model_dump())
    else:
        out.print(sandbox_table([sbx.info]))


@sandbox_app.command("exec")
def exec_(
    sandbox_id: str,
    cmd: Annotated[list[str], typer.Argument(help="command (joined with spaces, run by /bin/sh -c)")],
    timeout: Annotated[float, typer.Option("--timeout", help="seconds")] = 60.0,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Run a command in a sandbox; stream its output (or print a JSON result); exit with its exit code."""
    from ..sdk.sandbox import Sandbox

    try:
        sbx = Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key)
        try:
            if as_json:
                result = sbx.exec(" ".join(cmd), timeout_seconds=timeout)
                print_json(
                    {
                        "stdout": result.stdout,
                        "stderr": result.stderr,
                        "exit_code": result.exit_code,
                        "duration_ms": result.duration_ms,
                    }
                )
                raise typer.Exit(result.exit_code)
            code = 0
            for event in sbx.exec_stream(" ".join(cmd), timeout_seconds=timeout):
                if event.kind == "stdout":
                    sys.stdout.write(event.chunk)
                    sys.stdout.flush()
                elif event.kind == "stderr":
                    sys.stderr.write(event.chunk)
                    sys.stderr.flush()
                elif event.exit_code is not None:
                    code = event.exit_code
            raise typer.Exit(code)
        finally:
            sbx.close()
    except CryoboxError as error:
        fail(error)


@sandbox_app.command("cp")
def cp(
    source: Annotated[str, typer.Argument(help="LOCAL_PATH or SANDBOX_ID:/guest/path")],
    dest: Annotated[str, typer.Argument(help="LOCAL_PATH or SANDBOX_ID:/guest/path")],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Copy a file into (local -> sbx:/path) or out of (sbx:/path -> local) a sandbox."""
    from ..sdk.sandbox import Sandbox

    src_remote = ":/" in source and not Path(source).exists()
    dst_remote = ":/" in dest
    if src_remote == dst_remote:
        raise typer.BadParameter("exactly one of SOURCE and DEST must be SANDBOX_ID:/path")
    remote = source if src_remote else dest
    sandbox_id, _, guest_path = remote.partition(":")
    try:
        sbx = Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key)
        try:
            if src_remote:
                data = sbx.filesystem.read(guest_path)
                Path(dest).write_bytes(data)
                err.print(f"{len(data)} bytes -> {dest}")
            else:
                written = sbx.filesystem.write(guest_path, Path(source).read_bytes())
                err.print(f"{written} bytes -> {sandbox_id}:{guest_path}")
        finally:
            sbx.close()
    except CryoboxError as error:
        fail(error)


@sandbox_app.command("url")
def url(
    remote: Annotated[str, typer.Argument(help="SANDBOX_ID:/guest/path")],
    write: Annotated[bool, typer.Option("--write", help="a URL that PUTs the file (default: one to GET)")] = False,
    expires_in: Annotated[int | None, typer.Option("--expires-in", help="seconds (default 3600; 7 days max)")] = None,
    user: Annotated[str | None, typer.Option("--user", help="who a written file belongs to (--write only)")] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Print a signed URL that reads (or, --write, writes) one guest file with no API key (e.g. for curl)."""
    sandbox_id, _, guest_path = remote.partition(":")
    if not guest_path.startswith("/"):
        raise typer.BadParameter("expected SANDBOX_ID:/absolute/guest/path")
    with connected(sandbox_id, api_url, api_key) as sbx:
        operation: models.FileOperation = "write" if write else "read"
        signed = sbx.filesystem.signed_url(guest_path, operation, expires_in=expires_in, user=user)
    if as_json:
        print_json(signed.model_dump())
    else:
        out.print(signed.url, soft_wrap=True)
        err.print(f"{signed.method}, until {signed.expires_at}")


# --- power state, snapshots and forks -------------------------------------------------------------------------


def _power(action: str, sandbox_id: str, as_json: bool, api_url: str | None, api_key: str | None) -> None:
    with connected(sandbox_id, api_url, api_key) as sbx:
        getattr(sbx, action)()
    if as_json:
        print_json({"id": sbx.id, "status": sbx.info.status})
    else:
        err.print(f"{sbx.id}: {sbx.info.status}")


@sandbox_app.command("pause")
def pause(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Freeze a sandbox's vCPUs in place (until `resume`)."""
    _power("pause", sandbox_id, as_json, api_url, api_key)


@sandbox_app.command("resume")
def resume(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Continue a paused sandbox."""
    _power("resume", sandbox_id, as_json, api_url, api_key)


@sandbox_app.command("hibernate")
def hibernate(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Snapshot a sandbox to disk and stop it (`wake`, or any request to it, brings it back)."""
    _power("hibernate", sandbox_id, as_json, api_url, api_key)


@sandbox_app.command("wake")
def wake(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Restore a hibernated sandbox."""
    _power("wake", sandbox_id, as_json, api_url, api_key)


@sandbox_app.command("snapshot")
def snapshot(
    sandbox_id: str,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="KEY=VALUE (repeatable)")] = None,
    retain: Annotated[bool, typer.Option("--retain", help="keep it when the sandbox is deleted")] = False,
    quiesce: Annotated[bool, typer.Option("--quiesce", help="flush the guest's filesystems first")] = False,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Snapshot a sandbox (memory and disk; it keeps running) and print the snapshot id."""
    labels = parse_pairs(label, "label")
    with connected(sandbox_id, api_url, api_key) as sbx, err.status(f"snapshotting {sandbox_id}"):
        snap = sbx.snapshot(labels, retain=retain, quiesce=quiesce)
    if as_json:
        print_json(snapshot_json(snap))
        return
    out.print(snap.id)
    paused = "" if snap.pause_ms is None else f", paused {snap.pause_ms:.0f} ms"
    err.print(f"{snap.size_bytes} bytes ({snap.unique_bytes} unique, {snap.shared_bytes} shared){paused}")


@sandbox_app.command("fork")
def fork(
    sandbox_id: str, metadata: Metadata = None, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None
) -> None:
    """Create a sandbox booted from a copy of this one's disk (not its memory) and print its id."""
    with connected(sandbox_id, api_url, api_key) as sbx, err.status(f"forking {sandbox_id}"):
        child = sbx.fork(parse_pairs(metadata))
        child.close()
    if as_json:
        print_json({"parent_id": sbx.id, "sandbox": child.info.model_dump()})
    else:
        out.print(child.id)


@sandbox_app.command("fork-tree")
def fork_tree(
    sandbox_id: str,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="children to create (the API allows 1-16)")] = 2,
    metadata: Metadata = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Restore COUNT children from one snapshot of a sandbox (memory and disk); exit 1 if some failed."""
    with connected(sandbox_id, api_url, api_key) as sbx, err.status(f"forking {sandbox_id} x{count}"):
        tree = sbx.fork_tree(count, metadata=parse_pairs(metadata))
        tree.close()
    if as_json:
        print_json(
            {
                "tree_id": tree.tree_id,
                "parent_id": tree.parent_id,
                "snapshot_id": tree.snapshot_id,
                "children": [child.info.model_dump() for child in tree.children],
                "errors": [{"index": e.index, "error": e.error} for e in tree.errors],
            }
        )
    else:
        err.print(f"tree {tree.tree_id} from snapshot {tree.snapshot_id}")
        out.print(sandbox_table([child.info for child in tree.children]))
        for e in tree.errors:
            err.print(f"[red]child {e.index} failed[/red]: {e.error}")
    if tree.errors:
        raise typer.Exit(1)


@sandbox_app.command("promote")
def promote(
    sandbox_id: str,
    tree_id: Annotated[str, typer.Option("--tree", help="the fork tree (from `fork-tree`)")],
    cleanup: Annotated[bool, typer.Option("--cleanup/--keep-siblings", help="delete the other children")] = True,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Make a fork-tree child the winner (deleting its siblings by default); exit 1 if some could not be deleted."""
    with connected(sandbox_id, api_url, api_key) as sbx:
        result = sbx.promote(tree_id, cleanup_siblings=cleanup)
    if as_json:
        print_json(
            {
                "winner": result.winner,
                "tree_id": result.tree_id,
                "deleted": result.deleted,
                "failures": [{"id": f.id, "error": f.error} for f in result.failures],
            }
        )
    else:
        err.print(f"winner {result.winner}; deleted {len(result.deleted)}: {' '.join(result.deleted)}")
        for f in result.failures:
            err.print(f"[red]could not delete {f.id}[/red]: {f.error}")
    if result.failures:
        raise typer.Exit(1)


@sandbox_app.command("kill")
def kill(
    sandbox_ids: list[str],
    keep_snapshots: Annotated[
        bool, typer.Option("--keep-snapshots", help="keep the sandboxes' snapshots (default: delete unretained ones)")
    ] = False,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Delete sandboxes (and, unless --keep-snapshots, their snapshots not marked retain)."""
    from ..sdk import _requests
    from ..sdk._base import DEFAULT_RETRY
    from ..sdk._sync._http import send
    from ..sdk._transport import ClientConfig

    config = ClientConfig.resolve(api_url, api_key)
    killed: list[str] = []
    with config.client() as http:
        for sandbox_id in sandbox_ids:
            try:
                send(http, _requests.kill_request(sandbox_id, keep_snapshots=keep_snapshots), DEFAULT_RETRY)
            except CryoboxError as error:
                fail(error)
            killed.append(sandbox_id)
            if not as_json:
                err.print(f"killed {sandbox_id}")
    if as_json:
        print_json({"killed": killed})


@template_app.command("list")
def template_list(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List templates."""
    import httpx

    from .. import models
    from ..sdk._transport import ClientConfig, raise_for_error

    config = ClientConfig.resolve(api_url, api_key)
    try:
        with config.client() as http:
            response = http.get("/v1/templates")
            raise_for_error(response)
    except CryoboxError as error:
        fail(error)
        return
    except httpx.HTTPError as error:
        err.print(f"[red]error[/red]: {error}")
        raise typer.Exit(2) from error
    items = models.TemplateList.model_validate(response.json()).items
    if as_json:
        print_json([t.model_dump() for t in items])
        return
    table = Table("name", "cpu", "memory_mb", "generation", "status", "created")
    for t in items:
        table.add_row(t.name, str(t.cpu), str(t.memory_mb), t.generation, t.status, t.created_at)
    out.print(table)
