"""``cryobox gc --store``: collect the object store's garbage (see :mod:`cryobox.objstore.gc`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import typer
from rich.console import Console

from ..objstore.buildsteps import store_budget
from ..objstore.client import open_store
from ..objstore.gc import KINDS, GcPolicy, GcReport, collect
from ..objstore.leases import REFRESH_S
from ..registry.db import normalize_url
from ..registry.oracle import RegistryOracle, machine_id
from ._common import parse_duration

out = Console(soft_wrap=True)  # a line per object or summary, never broken at the terminal width (scripts grep it)
MIN_GRACE_S = 5 * REFRESH_S  # leases are re-put every REFRESH_S: a shorter grace could expire a live one


def run_store_gc(
    url: str,
    *,
    grace: str,
    keep_generations: int,
    dry_run: bool,
    as_json: bool,
    database_urls: Sequence[str] = (),
) -> GcReport:
    """One store GC run, consulting this machine's SQLite registries and the PostgreSQL ones at ``database_urls``
    about the snapshots and hibernations they claimed (:mod:`cryobox.objstore.owners`)."""
    grace_s = parse_duration(grace)
    if grace_s < MIN_GRACE_S:
        raise typer.BadParameter(f"--grace must be at least {MIN_GRACE_S:g}s (publishes re-put their leases)")
    policy = GcPolicy(grace_s=grace_s, keep_generations=keep_generations, dry_run=dry_run, step_budget=store_budget())
    oracle = RegistryOracle(machine_id(), [normalize_url(u) for u in database_urls if u.strip()])
    report = collect(open_store(url), policy, oracle=oracle)
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        print_report(report)
    return report


def print_report(report: GcReport) -> None:
    verb = "would remove" if report.dry_run else "removed"
    if report.dry_run:
        for removal in report.removed:
            out.print(
                f"would remove {removal.kind:10} {removal.key}  [dim]({_size(removal.size)})[/dim]", soft_wrap=True
            )
    for note in report.notes:
        out.print(f"[yellow]note[/yellow] {note}")
    for skipped in report.skipped:
        out.print(f"[yellow]kept[/yellow] {skipped}")
    if report.chunks_missing:
        out.print(f"[red]{len(report.chunks_missing)} chunk(s) named by live images are missing from the store[/red]")
    by_kind = report.by_kind()
    parts = [f"{n} {kind} ({_size(b)})" for kind in KINDS if (n := by_kind[kind][0]) for b in [by_kind[kind][1]]]
    out.print(f"{report.store}: {verb} {report.removed_objects} objects ({_size(report.removed_bytes)})")
    if parts:
        out.print("  " + ", ".join(parts))
    out.print(
        f"  kept {report.kept_objects} objects ({_size(report.kept_bytes)}), "
        f"{report.chunks_referenced} chunks referenced" + ("" if report.complete else "; [yellow]incomplete[/yellow]")
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
