"""``cryobox sandbox ...`` and ``cryobox template ...``: the API from the shell (through the SDK)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from .. import models
from ..errors import CryoboxError
from ..sdk._transport import ClientConfig, raise_for_error
from ..sdk.sandbox import Sandbox

sandbox_app = typer.Typer(help="Create, inspect, use and delete sandboxes.", no_args_is_help=True)
template_app = typer.Typer(help="Templates.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)

Json = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ApiUrl = Annotated[str | None, typer.Option("--api-url", envvar="CRYOBOX_API_URL", help="API base URL")]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="CRYOBOX_API_KEY", help="API key")]


def _fail(error: CryoboxError) -> None:
    err.print(f"[red]error[/red] ({error.code}): {error.message}")
    raise typer.Exit(2)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _sandbox_table(items: list[models.Sandbox]) -> Table:
    table = Table("id", "template", "status", "boot", "created", "metadata")
    for s in items:
        table.add_row(
            s.id,
            s.template,
            s.status,
            f"{s.boot_mode} {s.boot_ms:.0f} ms",
            s.created_at,
            " ".join(f"{k}={v}" for k, v in s.metadata.items()),
        )
    return table


def _metadata(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"metadata must be KEY=VALUE, not {pair!r}")
        result[key] = value
    return result


@sandbox_app.command("create")
def create(
    template: Annotated[str, typer.Option(help="template name")] = "code-interpreter",
    ttl: Annotated[int | None, typer.Option("--ttl", help="idle TTL in seconds")] = None,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", "-m", help="KEY=VALUE (repeatable)")] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Create a sandbox (a restore of the template's snapshot) and print its id."""
    try:
        with err.status(f"restoring a {template} sandbox"):
            sbx = Sandbox.create(
                template=template, ttl_seconds=ttl, metadata=_metadata(metadata or []), api_url=api_url, api_key=api_key
            )
        sbx.close()
    except CryoboxError as error:
        _fail(error)
        return
    if as_json:
        _print_json(sbx.info.model_dump())
    else:
        out.print(sbx.id)
        err.print(f"{sbx.info.boot_mode} in {sbx.info.boot_ms:.0f} ms")


@sandbox_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List sandboxes."""
    try:
        items = Sandbox.list(api_url=api_url, api_key=api_key)
    except CryoboxError as error:
        _fail(error)
        return
    if as_json:
        _print_json([s.model_dump() for s in items])
    else:
        out.print(_sandbox_table(items))


@sandbox_app.command("get")
def get(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Show one sandbox."""
    try:
        sbx = Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key)
        sbx.close()
    except CryoboxError as error:
        _fail(error)
        return
    if as_json:
        _print_json(sbx.info.model_dump())
    else:
        out.print(_sandbox_table([sbx.info]))


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
    try:
        sbx = Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key)
        try:
            if as_json:
                result = sbx.exec(" ".join(cmd), timeout_seconds=timeout)
                _print_json(
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
        _fail(error)


@sandbox_app.command("cp")
def cp(
    source: Annotated[str, typer.Argument(help="LOCAL_PATH or SANDBOX_ID:/guest/path")],
    dest: Annotated[str, typer.Argument(help="LOCAL_PATH or SANDBOX_ID:/guest/path")],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Copy a file into (local -> sbx:/path) or out of (sbx:/path -> local) a sandbox."""
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
        _fail(error)


@sandbox_app.command("kill")
def kill(sandbox_ids: list[str], api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Delete sandboxes."""
    config = ClientConfig.resolve(api_url, api_key)
    with config.client() as http:
        for sandbox_id in sandbox_ids:
            try:
                raise_for_error(http.delete(f"/v1/sandboxes/{sandbox_id}"))
            except CryoboxError as error:
                _fail(error)
            err.print(f"killed {sandbox_id}")


@template_app.command("list")
def template_list(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List templates."""
    config = ClientConfig.resolve(api_url, api_key)
    try:
        with config.client() as http:
            response = http.get("/v1/templates")
            raise_for_error(response)
    except CryoboxError as error:
        _fail(error)
        return
    except httpx.HTTPError as error:
        err.print(f"[red]error[/red]: {error}")
        raise typer.Exit(2) from error
    items = models.TemplateList.model_validate(response.json()).items
    if as_json:
        _print_json([t.model_dump() for t in items])
        return
    table = Table("name", "cpu", "memory_mb", "generation", "status", "created")
    for t in items:
        table.add_row(t.name, str(t.cpu), str(t.memory_mb), t.generation, t.status, t.created_at)
    out.print(table)
