"""The summary of one ``cryobox bench snapshot`` run (:func:`build_result`): pure functions over the raw
:class:`Samples`, the targets they are checked against, and the JSON keys the closing notes quote."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..agent.vm import qemu as qemu_binary
from .snapshot_report import BenchError
from .stats import stats

TREE_COUNT = 16
CAPTURE_FIELDS = ("pause_ms", "qemu_downtime_ms", "prepopulate_ms", "migrate_ms", "total_ms")
DIRTY_MIB = 64
_MIB = 1 << 20

TARGETS: dict[str, float] = {
    "pause_ms_512_max": 100,
    "pause_ratio_max": 1.5,
    "fork_tree_over_restore_max": 8,
    "pss_ratio_max": 0.25,
    "pause_ms_issue18_max": 30,
    "pause_ratio_issue18_max": 1.2,
    "lazy_pause_ms_max": 100,
    "dirty_sweep_s_per_gib_max": 0.5,
}
PRIVATE_COPY_BASIS = (
    "allocated bytes (st_blocks * 512) of the fork-tree snapshot's sparse memory image "
    "(<data_dir>/vol/snapshots/<id>/memory; zero pages are holes), i.e. the guest RAM one child would need "
    "as a private copy"
)
PSS_BASIS = (
    "pss_16_restores_mib: sum of the Pss line of /proc/<pid>/smaps_rollup over the 16 fork-tree children's QEMU "
    "processes (found by -pidfile under <data_dir>/vol/run, new since before the fork-tree), whole processes "
    "(QEMU and its TCG code buffer included); pss_guest_ram_16_restores_mib: the part of it in the mapping of the "
    "snapshot's hot memory copy on tmpfs (shared pages plus copy-on-write copies); pages of that hot copy no child "
    "maps are in no process's Pss (hot_copy_mib is its whole size)"
)


def stats_n(samples: list[float]) -> dict[str, float]:
    """:func:`.stats.stats` plus the sample count."""
    if not samples:
        raise BenchError("no samples")
    return {**stats(samples), "n": len(samples)}


@dataclass
class Samples:
    """Raw measurements of one run (what :func:`build_result` summarises)."""

    pause_512: list[float] = field(default_factory=list)
    pause_2048: list[float] = field(default_factory=list)
    snapshot_wall_512: list[float] = field(default_factory=list)
    snapshot_wall_2048: list[float] = field(default_factory=list)
    snapshot_size_512: list[float] = field(default_factory=list)
    restore_total: list[float] = field(default_factory=list)
    restore_call: list[float] = field(default_factory=list)
    restore_first_exec: list[float] = field(default_factory=list)
    restore_boot: list[float] = field(default_factory=list)
    tree_total_ms: float = 0.0
    tree_call_ms: float = 0.0
    tree_child_ready_ms: list[float] = field(default_factory=list)
    tree_child_boot: list[float] = field(default_factory=list)
    pss_children_mib: list[float] = field(default_factory=list)
    rss_children_mib: list[float] = field(default_factory=list)
    pss_shmem_children_mib: list[float] = field(default_factory=list)
    pss_ram_children_mib: list[float] = field(default_factory=list)
    cow_ram_children_mib: list[float] = field(default_factory=list)
    capture_512: list[dict[str, float]] = field(default_factory=list)
    capture_2048: list[dict[str, float]] = field(default_factory=list)
    snapshot_memory_bytes: int = 0
    hot_copy_bytes: int | None = None
    guest_used_mib: float = 0.0
    lazy_pause: list[float] = field(default_factory=list)
    lazy_capture: list[dict[str, float]] = field(default_factory=list)
    dirty_sweep: list[dict[str, Any]] = field(default_factory=list)
    shm_before_bytes: int | None = None
    shm_after_bytes: int | None = None
    capture_modes: dict[str, list[str]] = field(default_factory=dict)
    """Per step (``512``, ``2048``, ``lazy``), the ``mode`` of each capture (background, precopy, stopped)."""


def sweep_slope(points: list[dict[str, Any]], key: str) -> float | None:
    """Seconds of snapshot time per GiB dirtied, between the smallest and the largest point of the sweep."""
    if len(points) < 2:
        return None
    low, high = min(points, key=lambda p: p["dirtied_mib"]), max(points, key=lambda p: p["dirtied_mib"])
    gib = (high["dirtied_mib"] - low["dirtied_mib"]) / 1024
    return round((high[key] - low[key]) / 1000 / gib, 2) if gib > 0 else None


def _within(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def _ratio(num: float, den: float) -> float:
    if den <= 0:
        raise BenchError(f"cannot form a ratio over {den}")
    return round(num / den, 3)


def _capture_stats(captures: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per field of the server's capture timing, the stats over the runs that reported it."""
    keys = [k for k in CAPTURE_FIELDS if any(k in c for c in captures)]
    return {k: stats_n([c[k] for c in captures if k in c]) for k in keys}


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / _MIB, 1)


def build_result(
    s: Samples,
    *,
    n: int,
    cores: int,
    accelerator: str,
    qemu: str,
    server_version: str,
    measured_at: str,
    qemu_path: str = qemu_binary.QEMU_BINARY,
) -> dict[str, Any]:
    pause_512, pause_2048, restore = stats_n(s.pause_512), stats_n(s.pause_2048), stats_n(s.restore_total)
    pss_16 = sum(s.pss_children_mib)
    private_copy_mib = s.snapshot_memory_bytes / _MIB
    private_16 = TREE_COUNT * private_copy_mib
    result: dict[str, Any] = {
        "n": n,
        "machine": {"cores": cores, "accelerator": accelerator},
        "qemu": qemu,
        "server_version": server_version,
        "dirty_mib": DIRTY_MIB,
        "pause_ms_512": pause_512,
        "pause_ms_2048": pause_2048,
        "pause_ratio": _ratio(pause_2048["p50"], pause_512["p50"]),
        "snapshot_ms": stats_n(s.snapshot_wall_512),
        "snapshot_ms_2048": stats_n(s.snapshot_wall_2048),
        "snapshot_size_mib_512": stats_n([b / _MIB for b in s.snapshot_size_512]),
        "restore_ms": restore,
        "restore_call_ms": stats_n(s.restore_call),
        "restore_first_exec_ms": stats_n(s.restore_first_exec),
        "restore_boot_ms": stats_n(s.restore_boot),
        "fork_tree16_ms": round(s.tree_total_ms, 1),
        "fork_tree16_call_ms": round(s.tree_call_ms, 1),
        "fork_tree16_child_ready_ms": stats_n(s.tree_child_ready_ms),
        "fork_tree16_child_boot_ms": stats_n(s.tree_child_boot),
        "fork_tree_over_restore": _ratio(s.tree_total_ms, restore["p50"]),
        "pss_16_restores_mib": round(pss_16, 1),
        "pss_per_restore_mib": stats_n(s.pss_children_mib),
        "pss_shmem_16_restores_mib": round(sum(s.pss_shmem_children_mib), 1),
        "pss_guest_ram_16_restores_mib": round(sum(s.pss_ram_children_mib), 1),
        "guest_ram_cow_16_restores_mib": round(sum(s.cow_ram_children_mib), 1),
        "pss_qemu_other_16_restores_mib": round(pss_16 - sum(s.pss_ram_children_mib), 1),
        "rss_16_restores_mib": round(sum(s.rss_children_mib), 1),
        "private_copy_mib": round(private_copy_mib, 1),
        "private_copies_16_mib": round(private_16, 1),
        "private_copy_basis": PRIVATE_COPY_BASIS,
        "pss_basis": PSS_BASIS,
        "pss_ratio": _ratio(pss_16, private_16),
        "pss_ratio_guest_ram": _ratio(sum(s.pss_ram_children_mib), private_16),
        "hot_copy_mib": None if s.hot_copy_bytes is None else round(s.hot_copy_bytes / _MIB, 1),
        "guest_used_mib": round(s.guest_used_mib, 1),
        "capture_512": _capture_stats(s.capture_512),
        "capture_2048": _capture_stats(s.capture_2048),
        "qemu_binary": qemu_path,
        "capture_modes": {step: sorted(set(modes)) for step, modes in s.capture_modes.items()},
        "lazy_pause_ms": stats_n(s.lazy_pause) if s.lazy_pause else None,
        "lazy_capture": _capture_stats(s.lazy_capture),
        "dirty_sweep": list(s.dirty_sweep),
        "dirty_sweep_s_per_gib": sweep_slope(s.dirty_sweep, "snapshot_ms"),
        "dirty_sweep_s_per_gib_again": sweep_slope(s.dirty_sweep, "snapshot_ms_again"),
        "shm_mib_before_snapshots": _mib(s.shm_before_bytes),
        "shm_mib_after_10_snapshots": _mib(s.shm_after_bytes),
        "samples": {
            "pause_ms_512": s.pause_512,
            "pause_ms_2048": s.pause_2048,
            "snapshot_ms": [round(v, 1) for v in s.snapshot_wall_512],
            "snapshot_ms_2048": [round(v, 1) for v in s.snapshot_wall_2048],
            "restore_ms": [round(v, 1) for v in s.restore_total],
            "restore_first_exec_ms": [round(v, 1) for v in s.restore_first_exec],
            "lazy_pause_ms": s.lazy_pause,
        },
        "targets": dict(TARGETS),
        "measured_at": measured_at,
    }
    result["checks"] = {
        "pause_ms_512_p50": pause_512["p50"] <= TARGETS["pause_ms_512_max"],
        "pause_ratio": result["pause_ratio"] <= TARGETS["pause_ratio_max"],
        "fork_tree_over_restore": result["fork_tree_over_restore"] <= TARGETS["fork_tree_over_restore_max"],
        "pss_ratio": result["pss_ratio"] <= TARGETS["pss_ratio_max"],
        "pause_ms_issue18": max(pause_512["p50"], pause_2048["p50"]) <= TARGETS["pause_ms_issue18_max"],
        "pause_ratio_issue18": result["pause_ratio"] <= TARGETS["pause_ratio_issue18_max"],
        "lazy_pause_ms": bool(s.lazy_pause) and stats(s.lazy_pause)["p50"] <= TARGETS["lazy_pause_ms_max"],
        "dirty_sweep_s_per_gib": _within(result["dirty_sweep_s_per_gib"], TARGETS["dirty_sweep_s_per_gib_max"]),
        "dirty_sweep_s_per_gib_again": _within(
            result["dirty_sweep_s_per_gib_again"], TARGETS["dirty_sweep_s_per_gib_max"]
        ),
    }
    return result
