"""``cryobox gc``: reclaim the host resources of data dirs that will never start again
(see :mod:`cryobox.agent.host.gc`); ``cryobox gc --store``: delete what no live image needs from the object
store (:mod:`.storegc_cmd`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import Paths
from ._common import err, stdout_console

if TYPE_CHECKING:  # the host's GC (agent/) and the store's (objstore/, the registries) load when gc runs
    from ..agent.host.gc import Outcome, Plan
    from ..agent.host.gcscan import Roots

out = stdout_console()


def gc(
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="reclaim this data dir's resources (if no agent holds its lock)"),
    ] = None,
    all_unowned: Annotated[
        bool,
        typer.Option("--all-unowned", help="also hot dirs, netns tags and nft tables no owner record claims"),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only print what would be reclaimed")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="with --data-dir: kill its VMs that still run without asking (their sandboxes are lost)"
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    store: Annotated[
        bool,
        typer.Option("--store", help="collect the object store instead: old generations, leftovers, unused chunks"),
    ] = False,
    store_url: Annotated[
        str | None,
        typer.Option(
            "--store-url", envvar="CRYOBOX_STORE_URL", help="with --store: the store (default: the local one)"
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option("--cache-dir", help="with --store: whose local store (default /var/cache/cryobox)")
    ] = None,
    grace: Annotated[
        str, typer.Option("--grace", help="with --store: keep what is younger than this (publishes in flight)")
    ] = "1h",
    keep_generations: Annotated[
        int, typer.Option("--keep-generations", help="with --store: newest generations kept per template")
    ] = 2,
    database_urls: Annotated[
        list[str] | None,
        typer.Option(
            "--database-url",
            envvar="CRYOBOX_DATABASE_URL",
            help="with --store: a fleet's PostgreSQL registry to consult (repeatable); this machine's SQLite "
            "registries are consulted by themselves",
        ),
    ] = None,
) -> None:
    """Reclaim QEMUs, memory servers, mounts, network namespaces and links, nft tables and hot dirs of data dirs
    that are gone (their owner record remains, their agent.lock does not) or, with --data-dir, not locked.
    With --store: delete template generations nothing needs, leftovers of images without a manifest and chunk
    objects no live image names, once older than --grace; and stored snapshots and hibernations whose registry is
    gone or no longer lists them (this machine's data dirs, and the PostgreSQL registries given)."""
    if store:
        from .storegc_cmd import run_store_gc

        url = store_url or Paths.from_env(cache_dir=cache_dir).default_store_url
        run_store_gc(
            url,
            grace=grace,
            keep_generations=keep_generations,
            dry_run=dry_run,
            as_json=as_json,
            database_urls=database_urls or [],
        )
        return
    from ..agent.host.gcscan import Roots
    from ..agent.host.ownership import owners_dir_from_env

    roots = Roots(owners=owners_dir_from_env())
    run(roots, data_dir, all_unowned=all_unowned, dry_run=dry_run, as_json=as_json, force=force)


def run(
    roots: Roots, data_dir: Path | None, *, all_unowned: bool, dry_run: bool, as_json: bool, force: bool = False
) -> list[Outcome]:
    from ..agent.host.gc import apply, plan
    from ..agent.host.gcscan import host_effects, scan

    state, explicit = scan(roots, data_dir, deep=all_unowned)
    todo = plan(state, explicit, all_unowned=all_unowned)
    if data_dir is not None and todo.vms and not dry_run and not force:
        _confirm_vms(data_dir, len(todo.vms))
    outcomes = [] if dry_run else apply(todo, host_effects(roots))
    if as_json:
        sys.stdout.write(json.dumps(_json(todo, outcomes, dry_run), indent=2) + "\n")
    else:
        _print(todo, outcomes, dry_run)
    return outcomes


def _confirm_vms(data_dir: Path, count: int) -> None:
    """A kept data dir's VMs still run its sandboxes: ask before killing them (a terminal), else refuse (exit 2)."""
    question = f"{count} VM(s) of {data_dir} still run (kept sandboxes): kill them and lose those sandboxes?"
    if sys.stdin.isatty() and typer.confirm(question, default=False):
        return
    err.print(f"[red]refused[/red]: {question.replace('?', '')} — answer yes on a terminal, or pass --force")
    raise typer.Exit(2)


def _json(todo: Plan, outcomes: list[Outcome], dry_run: bool) -> dict[str, object]:
    items = [a.to_json() for a in todo.actions] if dry_run else [o.to_json() for o in outcomes]
    return {"dry_run": dry_run, "reclaimed" if not dry_run else "would_reclaim": items, "skipped": todo.skipped}


def _print(todo: Plan, outcomes: list[Outcome], dry_run: bool) -> None:
    for note in todo.skipped:
        out.print(f"[yellow]skipped[/yellow] {note}")
    if not todo.actions:
        out.print("nothing to reclaim")
        return
    if dry_run:
        for action in todo.actions:
            out.print(f"would reclaim {action.kind:8} {action.target}  [dim]({action.owner})[/dim]")
        return
    for outcome in outcomes:
        a = outcome.action
        status = "[green]reclaimed[/green]" if outcome.error is None else f"[red]failed[/red] ({outcome.error})"
        out.print(f"{status} {a.kind:8} {a.target}  [dim]({a.owner})[/dim]")
    from ..agent.host.gc import summary

    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(summary(outcomes).items()))
    out.print(f"reclaimed: {counts or 'nothing'}")
