"""The snapshot bench's report: its tables and the side-by-side JSON of several QEMU binaries."""

from __future__ import annotations

import re
from typing import Any

from rich.table import Table

SHM_SNAPSHOTS = 10
"""Snapshots taken before the hot directory is measured again."""


class BenchError(RuntimeError):
    """A step of the benchmark failed; no figures are produced."""


def version_key(version_line: str) -> str:
    """``"10.0.2"`` for ``QEMU emulator version 10.0.2 (Debian ...)`` (the whole line if it has no number)."""
    found = re.search(r"version (\d+(?:\.\d+)*)", version_line)
    return found.group(1) if found else version_line


COMPARED = (
    ("pause_ms_512_p50", ("pause_ms_512", "p50")),
    ("pause_ms_2048_p50", ("pause_ms_2048", "p50")),
    ("pause_ratio", ("pause_ratio",)),
    ("qemu_downtime_ms_512_p50", ("capture_512", "qemu_downtime_ms", "p50")),
    ("qemu_downtime_ms_2048_p50", ("capture_2048", "qemu_downtime_ms", "p50")),
    ("snapshot_ms_p50", ("snapshot_ms", "p50")),
    ("snapshot_ms_2048_p50", ("snapshot_ms_2048", "p50")),
    ("restore_ms_p50", ("restore_ms", "p50")),
    ("lazy_pause_ms_p50", ("lazy_pause_ms", "p50")),
    ("shm_mib_after_10_snapshots", ("shm_mib_after_10_snapshots",)),
    ("dirty_sweep_s_per_gib", ("dirty_sweep_s_per_gib",)),
    ("dirty_sweep_s_per_gib_again", ("dirty_sweep_s_per_gib_again",)),
)


def _dig(result: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict) or value.get(key) is None:
            return None
        value = value[key]
    return value


def combine_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One JSON for several binaries: the first (default) binary's result at the top level, every binary's under
    ``by_qemu[<version>]`` and the headline numbers side by side in ``qemu_comparison``."""
    if not results:
        raise BenchError("no results")
    by_qemu: dict[str, dict[str, Any]] = {}
    for result in results:
        key = version_key(str(result["qemu"]))
        if key in by_qemu:
            key = f"{key} ({result['qemu_binary']})"
        by_qemu[key] = result
    comparison = {name: {key: _dig(r, path) for key, r in by_qemu.items()} for name, path in COMPARED}
    return {**results[0], "by_qemu": by_qemu, "qemu_comparison": comparison}


def _fmt(value: float) -> str:
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def result_table(result: dict[str, Any]) -> Table:
    """The result as a table that fits 80 columns (targets are checked on p50s)."""
    machine = result["machine"]
    table = Table(title=f"cryobox bench snapshot ({machine['accelerator']}, {machine['cores']} cores, n={result['n']})")
    for col in ("metric", "p50", "p90", "max", "n", "target"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    targets, checks = result["targets"], result["checks"]

    def verdict(ok: bool, limit: float) -> str:
        return f"[green]≤ {limit} ok[/]" if ok else f"[red]≤ {limit} MISS[/]"

    def row(label: str, st: dict[str, float], target: str = "") -> None:
        table.add_row(label, _fmt(st["p50"]), _fmt(st["p90"]), _fmt(st["max"]), str(st["n"]), target)

    def single(label: str, value: float, target: str = "", ratio: bool = False) -> None:
        table.add_row(label, f"{value:.2f}" if ratio else _fmt(value), "", "", "", target)

    row(
        f"pause ms 512M ({result['dirty_mib']}M dirty)",
        result["pause_ms_512"],
        verdict(checks["pause_ms_512_p50"], targets["pause_ms_512_max"]),
    )
    row("pause ms 2048M", result["pause_ms_2048"])
    for mib in (512, 2048):
        if "qemu_downtime_ms" in result[f"capture_{mib}"]:
            row(f"  QEMU downtime ms {mib}M", result[f"capture_{mib}"]["qemu_downtime_ms"])
    single(
        "pause ratio 2048M/512M",
        result["pause_ratio"],
        verdict(checks["pause_ratio"], targets["pause_ratio_max"]),
        ratio=True,
    )
    row("snapshot call ms 512M", result["snapshot_ms"])
    row("snapshot call ms 2048M", result["snapshot_ms_2048"])
    row("restore ms (+first exec)", result["restore_ms"])
    row("  create call ms", result["restore_call_ms"])
    row("  first exec ms", result["restore_first_exec_ms"])
    row("  server boot_ms", result["restore_boot_ms"])
    single("fork-tree 16 ms (all exec)", result["fork_tree16_ms"])
    single("  fork-tree call ms", result["fork_tree16_call_ms"])
    row("  child boot_ms", result["fork_tree16_child_boot_ms"])
    single(
        "fork-tree / restore p50",
        result["fork_tree_over_restore"],
        verdict(checks["fork_tree_over_restore"], targets["fork_tree_over_restore_max"]),
        ratio=True,
    )
    single("Pss 16 restores MiB", result["pss_16_restores_mib"])
    row("  Pss per restore MiB", result["pss_per_restore_mib"])
    single("  guest RAM map MiB", result["pss_guest_ram_16_restores_mib"])
    single("  rest of QEMU MiB", result["pss_qemu_other_16_restores_mib"])
    single("  Rss 16 restores MiB", result["rss_16_restores_mib"])
    single("private copy MiB", result["private_copy_mib"])
    single("16 private copies MiB", result["private_copies_16_mib"])
    single("Pss ratio", result["pss_ratio"], verdict(checks["pss_ratio"], targets["pss_ratio_max"]), ratio=True)
    single("  guest RAM map only", result["pss_ratio_guest_ram"], ratio=True)
    if result.get("lazy_pause_ms"):
        row("lazy pause ms (512M)", result["lazy_pause_ms"])
    for point in result.get("dirty_sweep", []):
        single(f"2048M, {point['dirtied_mib']:.0f}M dirtied: snap ms", point["snapshot_ms"])
        if point.get("snapshot_ms_again") is not None:
            single("  again (warm buffer) ms", point["snapshot_ms_again"])
        single("  unique MiB", point["unique_mib"])
        single("  shared MiB", point["shared_mib"])
    for key, label in (("dirty_sweep_s_per_gib", "sweep s/GiB dirtied"), ("dirty_sweep_s_per_gib_again", "  again")):
        if result.get(key) is not None:
            limit = targets.get("dirty_sweep_s_per_gib_max", 0.5)
            single(label, result[key], verdict(checks.get(key, False), limit), ratio=True)
    if result.get("shm_mib_after_10_snapshots") is not None:
        single(f"hot dir MiB after {SHM_SNAPSHOTS} snaps", result["shm_mib_after_10_snapshots"])
    return table


def comparison_table(result: dict[str, Any]) -> Table:
    """The headline numbers of every binary measured, side by side."""
    versions = list(result["by_qemu"])
    table = Table(title="QEMU binaries compared")
    table.add_column("metric")
    for version in versions:
        table.add_column(version, justify="right")
    for name, values in result["qemu_comparison"].items():
        table.add_row(name, *("" if values[v] is None else _fmt(float(values[v])) for v in versions))
    return table
