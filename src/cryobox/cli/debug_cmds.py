"""``cryobox debug`` (restore a captured failure and look inside) and ``cryobox bisect`` (fork a state and
count how many children reproduce)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import CryoboxError
from ._common import ApiKey, ApiUrl, Json, err, fail, print_json

if TYPE_CHECKING:  # the capture tools and the SDK load when a command runs
    from ..capture.debug import DebugReport


def debug(
    snapshot: Annotated[str, typer.Argument(help="a captured failure's snapshot id")],
    shell: Annotated[bool, typer.Option("--shell", help="then open an interactive shell in the restored copy")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="leave the restored sandbox running")] = False,
    cmd: Annotated[str | None, typer.Option("--cmd", help="the --shell command (default: a login shell)")] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Restore SNAPSHOT into an independent sandbox; print /failure.json, the processes, the test log's tail
    and, for a hang, the stuck process's kernel stack and open files. The copy is killed unless --keep."""
    from ..capture.debug import ShellError, open_shell
    from ..capture.debug import debug as run_debug
    from ..sdk import ClientConfig, Sandbox

    config = ClientConfig.resolve(api_url, api_key)
    exit_code: list[int | None] = []

    def show(report: DebugReport) -> None:
        if as_json:
            print_json(report.to_json())
        else:
            sys.stdout.write(report.render())
        sys.stdout.flush()

    def run_shell(sandbox_id: str) -> None:
        err.print(f"shell in {sandbox_id} (exit the shell to end{'' if keep else ' and kill the copy'})")
        try:
            exit_code.append(open_shell(config.api_url, config.api_key, sandbox_id, cmd=cmd))
        except ShellError as error:
            err.print(f"[red]shell failed[/red] ({error.code}): {error.message}")
            raise typer.Exit(2) from error

    try:
        report = run_debug(
            snapshot,
            lambda snap: Sandbox.create(from_snapshot=snap, api_url=config.api_url, api_key=config.api_key),
            keep=keep,
            shell=run_shell if shell else None,
            show=show,
            progress=lambda line: err.print(f"[dim]{line}[/dim]"),
        )
    except CryoboxError as error:
        fail(error)
    if keep:
        err.print(f"kept {report.sandbox_id} (cryobox sandbox kill {report.sandbox_id})")


def bisect(
    target: Annotated[str, typer.Argument(help="a sandbox id, or a snapshot id (snap-...) restored first")],
    command: Annotated[list[str], typer.Argument(help="the command (after --), run with /bin/sh -c")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=16, help="children to fork (1-16)")] = 16,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds per child; running longer counts as reproduced")
    ] = 300.0,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Fork TARGET into --count children restored from one snapshot, run COMMAND in all of them at once and
    report how many reproduce (exit non-zero). 0 or all: the outcome is already decided in that state."""
    text = " ".join(command)
    if not text.strip():
        raise typer.BadParameter("give the command after --")
    from ..capture.bisect import bisect as run_bisect
    from ..capture.bisect import sdk_api

    try:
        report = run_bisect(
            target,
            text,
            sdk_api(api_url, api_key),
            count=count,
            timeout_s=timeout,
            progress=lambda line: err.print(f"[dim]{line}[/dim]"),
        )
    except CryoboxError as error:
        fail(error)
    if as_json:
        print_json(report.to_json())
    else:
        sys.stdout.write(report.render() + "\n")
