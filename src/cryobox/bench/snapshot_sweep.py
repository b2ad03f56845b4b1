"""The dirty sweep of ``cryobox bench snapshot``: what a snapshot of a 2 GiB guest costs for 16, 64 and 256 MiB
written since its restore, end to end (the API call) and in bytes.

Each size is measured on :data:`SWEEP_REPS` sandboxes, each snapshotted twice (its first snapshot, then again
with the staging buffer warm, as a sandbox snapshotted again and again is), and the sweep reports the p50 of
each: single samples on a small host spread widely, and the slope between the sweep's ends is what the
≤ 0.5 s per GiB dirtied promise (docs/SPECIFICATION.md) is checked against.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from ..config import Paths
from .snapshot_api import Api
from .snapshot_report import BenchError
from .snapshot_result import _MIB, Samples
from .stats import percentile

SWEEP_TEMPLATE = "bench-2g"
SWEEP_MIB = (16, 64, 256)
SWEEP_REPS = 3


def read_manifest(paths: Paths, snapshot_id: str) -> dict[str, Any]:
    manifest = paths.snapshots_dir / snapshot_id / "manifest.json"
    try:
        found: dict[str, Any] = json.loads(manifest.read_text())
    except (OSError, ValueError) as err:
        raise BenchError(f"cannot read {manifest}: {err}") from err
    return found


def sweep_cmd(mib: int) -> str:
    return f"dd if=/dev/urandom of=/dev/shm/sweep bs=1M count={mib} status=none"


def _p50(samples: list[float]) -> float:
    return round(percentile(samples, 50), 1)


def dirty_sweep(
    api: Api,
    paths: Paths,
    s: Samples,
    console: Console,
    reps: int = SWEEP_REPS,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Per size, ``reps`` 2 GiB sandboxes that write ``mib`` of fresh random data (kept resident in the guest's
    tmpfs), each snapshotted twice; one entry per size in ``s.dirty_sweep``."""
    for mib in SWEEP_MIB:
        first: list[float] = []
        again: list[float] = []
        manifests: list[dict[str, Any]] = []
        for _ in range(reps):
            sbx = api.create({"template": SWEEP_TEMPLATE})
            api.exec(sbx["id"], sweep_cmd(mib))
            for walls in (first, again):
                started = clock()
                snap = api.snapshot(sbx["id"])
                walls.append(round((clock() - started) * 1000, 1))
                manifests.append(read_manifest(paths, snap["id"]))
                api.delete_snapshot(snap["id"])
            api.delete_sandbox(sbx["id"])
        manifest = manifests[0]
        s.dirty_sweep.append(
            {
                "dirtied_mib": float(mib),
                "unique_mib": round(float(manifest.get("unique_bytes", 0) or 0) / _MIB, 1),
                "shared_mib": round(float(manifest.get("shared_bytes", 0) or 0) / _MIB, 1),
                "snapshot_ms": _p50(first),
                "snapshot_ms_again": _p50(again),
                "snapshot_ms_samples": first,
                "snapshot_ms_again_samples": again,
                "pause_ms": [m["capture"].get("pause_ms") for m in manifests],
                "steps_ms": [m["capture"].get("steps_ms", {}) for m in manifests],
                "counts": manifest["capture"].get("counts", {}),
            }
        )
        point = s.dirty_sweep[-1]
        console.print(
            f"  dirtied {mib} MiB: {point['unique_mib']} MiB unique, snapshot p50 {point['snapshot_ms']} ms "
            f"(again {point['snapshot_ms_again']}), samples {first} / {again}"
        )
