"""``cryobox keys ...``: API keys, managed directly in the registry (run on the server host)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..agent.sandbox import rfc3339
from ..config import Paths
from ..errors import CryoboxError

if TYPE_CHECKING:  # the registry (SQLAlchemy, Alembic) is imported when a keys command runs, not at CLI start
    from ..registry import Registry

keys_app = typer.Typer(help="API keys (stored hashed; the plaintext is shown once).", no_args_is_help=True)
out = Console()
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
