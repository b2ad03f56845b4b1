"""``cryobox keys ...``: API keys, managed directly in the registry (run on the server host)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..config import Paths
from ..errors import CryoboxError, NotFound
from ..util.times import rfc3339
from ._common import stdout_console

if TYPE_CHECKING:  # the registry (SQLAlchemy, Alembic) is imported when a keys command runs, not at CLI start
    from ..registry import Registry, WorkspaceInfo

keys_app = typer.Typer(
    help="API keys (stored hashed; the plaintext is shown once) and workspace quotas.", no_args_is_help=True
)
out = stdout_console()
err = Console(stderr=True)

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="platform state (default /var/lib/cryobox; CRYOBOX_DATABASE_URL wins)")
]
Json = Annotated[bool, typer.Option("--json", help="machine-readable output")]


@contextmanager
def _registry(data_dir: Path | None) -> Iterator[Registry]:
    from ..registry import Registry

    registry = Registry.for_data_dir(Paths.from_env(data_dir).data_dir)
    try:
        registry.migrate()
        yield registry
    except CryoboxError as error:
        err.print(f"[red]error[/red] ({error.code}): {error.message}")
        raise typer.Exit(2) from error
    finally:
        registry.close()


@keys_app.command("create")
def create(
    workspace: Annotated[str, typer.Option(help="workspace name (created if new)")] = "default",
    name: Annotated[str, typer.Option(help="a label for the key")] = "",
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Create a key; prints the plaintext once."""
    with _registry(data_dir) as registry:
        ws = registry.ensure_workspace(workspace)
        info, plaintext = registry.create_key(ws.id, name)
    if as_json:
        sys.stdout.write(
            json.dumps({"id": info.id, "workspace": workspace, "workspace_id": ws.id, "name": name, "key": plaintext})
            + "\n"
        )
    else:
        out.print(plaintext)
        err.print(f"key {info.id} for workspace {workspace}; it will not be shown again")


@keys_app.command("list")
def list_(data_dir: DataDir = None, as_json: Json = False) -> None:
    """List keys (never their secrets)."""
    with _registry(data_dir) as registry:
        names = {w.id: w.name for w in registry.list_workspaces()}
        keys = registry.list_keys()
    rows = [
        {
            "id": k.id,
            "workspace": names.get(k.workspace_id, k.workspace_id),
            "name": k.name,
            "prefix": k.prefix,
            "created_at": rfc3339(k.created_at),
            "revoked_at": rfc3339(k.revoked_at) if k.revoked_at else None,
        }
        for k in keys
    ]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table("id", "workspace", "name", "prefix", "created", "revoked")
    for r in rows:
        table.add_row(*(str(r[c] or "") for c in ("id", "workspace", "name", "prefix", "created_at", "revoked_at")))
    out.print(table)


@keys_app.command("revoke")
def revoke(key_id: str, data_dir: DataDir = None) -> None:
    """Revoke a key: requests with it get 401 from then on."""
    with _registry(data_dir) as registry:
        registry.revoke_key(key_id)
    err.print(f"revoked {key_id}")


@keys_app.command("quota")
def quota(
    workspace: Annotated[str, typer.Option(help="workspace name")] = "default",
    sandboxes: Annotated[int | None, typer.Option(min=0, help="sandboxes (starting|running|paused)")] = None,
    vcpus: Annotated[int | None, typer.Option(min=0, help="vCPUs of its sandboxes (hibernated ones hold none)")] = None,
    hibernated: Annotated[int | None, typer.Option(min=0, help="hibernated (paused) sandboxes it may keep")] = None,
    volumes: Annotated[int | None, typer.Option(min=0, help="volumes")] = None,
    volume_bytes: Annotated[int | None, typer.Option("--volume-bytes", min=0, help="bytes of volumes")] = None,
    memory_mib: Annotated[int | None, typer.Option("--memory-mib", min=0, help="memory of its sandboxes")] = None,
    snapshot_bytes: Annotated[int | None, typer.Option("--snapshot-bytes", min=0, help="bytes of snapshots")] = None,
    templates: Annotated[int | None, typer.Option(min=0, help="custom templates")] = None,
    default_ttl_s: Annotated[
        int | None, typer.Option("--default-ttl-s", min=0, help="TTL of creates that ask for none (0: never expire)")
    ] = None,
    max_ttl_s: Annotated[int | None, typer.Option("--max-ttl-s", min=1, help="the largest ttl_seconds allowed")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="back to the defaults (then apply any values given)")] = False,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Show a workspace's quota (limits and usage); with values, set its own limits (the rest keep theirs).

    Limits not set for the workspace are the server's defaults (CRYOBOX_QUOTA_* in the environment of this command
    and of the server). Running servers see a change at the next create.
    """
    from ..server.control.quotas import Quota, usage_of

    given = {
        "sandboxes": sandboxes,
        "vcpus": vcpus,
        "memory_mib": memory_mib,
        "snapshot_bytes": snapshot_bytes,
        "templates": templates,
        "default_ttl_s": default_ttl_s,
        "max_ttl_s": max_ttl_s,
        "hibernated": hibernated,
        "volumes": volumes,
        "volume_bytes": volume_bytes,
    }
    changes = {name: value for name, value in given.items() if value is not None}
    with _registry(data_dir) as registry:
        from ..registry import QuotaRecords

        records = QuotaRecords(registry.database)
        if changes or clear:
            ws = registry.ensure_workspace(workspace)
            if clear:
                records.clear(ws.id)
            if changes:
                records.set(ws.id, **changes)
        else:
            ws = _workspace(registry, workspace)
        defaults = Quota.from_env()
        use = records.use(ws.id)
    limits = defaults.with_overrides(use.overrides).limits()
    own = {name: value for name, value in use.overrides.values().items() if value is not None}
    usage = asdict(usage_of(use))
    if as_json:
        body = {"workspace": workspace, "workspace_id": ws.id, "limits": limits, "overrides": own, "usage": usage}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
        return
    table = Table("resource", "limit", "used", "source")
    for name, value in limits.items():
        source = "workspace" if name in own else "default"
        table.add_row(name, "none" if value is None else str(value), str(usage.get(name, "")), source)
    out.print(f"workspace {workspace} ({ws.id})")
    out.print(table)


def _workspace(registry: Registry, name: str) -> WorkspaceInfo:
    for ws in registry.list_workspaces():
        if ws.name == name:
            return ws
    raise NotFound(f"workspace {name!r} not found", details={"workspace": name})
