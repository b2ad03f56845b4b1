"""``cryobox bench snapshot``: what a live snapshot costs the sandbox and what restoring from one costs the host,
measured against a real ``cryobox serve`` (no pre-spawn pool, so the only QEMUs are the bench's sandboxes).

1. Pause window: a sandbox of ``base`` (512 MiB) and of a 2 GiB variant dirties 64 MiB of guest RAM (a file on
   the guest's tmpfs ``/dev/shm``), then is snapshotted; the server reports how long the guest was paused.
   The pause should not grow with guest memory (RAM is written while the guest runs).
2. Snapshot call: wall time of the ``POST .../snapshots`` (512 MiB), end to end.
3. Restore: ``POST /v1/sandboxes {"from_snapshot"}`` until it returns and the first ``exec true`` is answered.
4. Fork tree: ``POST .../fork-tree {"count": 16}`` until every child has answered ``exec true``.
5. Memory: Pss of the 16 fork-tree children's QEMUs against 16 private copies of the guest's touched memory.
6. Dirty sweep: a 2 GiB sandbox writes 16 / 64 / 256 MiB of fresh random data into its tmpfs, then is
   snapshotted; what the snapshot holds of its own (``unique_bytes``) and shares with its parent
   (``shared_bytes``, from the manifest; 0 where the agent does not record it), and the snapshot call's time.
7. Hot dir: bytes allocated in the agent's hot dir (tmpfs) after 10 snapshots of ``base`` sandboxes.
8. Lazy pause: a second server with ``--memory lazy`` (RAM paged from the memory server's FUSE file, which
   cannot be write-protected): the pause of its sandboxes' snapshots.

``--qemu PATH`` (repeatable) runs all of it again for each other QEMU binary (``CRYOBOX_QEMU`` of its servers):
the top-level keys describe the default binary (``CRYOBOX_QEMU`` or the system's), ``by_qemu`` holds every
binary's result under its version (``"7.2.22"``, ``"10.0.2"``) and ``qemu_comparison`` the headline numbers side
by side.

Everything goes through the HTTP API with plain ``httpx``; everything created is deleted in ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..agent.host.reclaim import find_own_qemus
from ..agent.vm import qemu as qemu_binary
from ..config import DEFAULT_CACHE_DIR, Paths
from ..errors import CryoboxError
from ..util.progress import Reporter
from .pss import allocated_bytes, parse_rollup, smaps_mapping_kib, sum_mib
from .report import write_result
from .server import ServeProcess
from .snapshot_api import Api, api_session, ms_since
from .snapshot_report import SHM_SNAPSHOTS, BenchError, combine_results, comparison_table, result_table
from .snapshot_result import _MIB, CAPTURE_FIELDS, DIRTY_MIB, TREE_COUNT, Samples, build_result
from .snapshot_sweep import SWEEP_MIB, SWEEP_REPS, SWEEP_TEMPLATE, dirty_sweep, read_manifest
from .stats import stats

BIG_TEMPLATE = SWEEP_TEMPLATE
BIG_MEMORY_MB = 2048
DIRTY_CMD = f"dd if=/dev/urandom of=/dev/shm/dirty bs=1M count={DIRTY_MIB} status=none"
HOT_ARGS = ["--templates", "base"]  # bench-2g is derived from it; nothing here uses another template
LAZY_ARGS = ["--memory", "lazy", "--no-prefetch", "--templates", "base", "--net-pool", "2"]
MIN_RESTORES = 10


def guest_used_mib(meminfo: str) -> float:
    """RAM the guest kernel has handed out (``MemTotal - MemFree``, page cache included), from ``/proc/meminfo``."""
    fields = parse_rollup(meminfo)
    if "MemTotal" not in fields or "MemFree" not in fields:
        raise BenchError("guest /proc/meminfo has no MemTotal/MemFree")
    return (fields["MemTotal"] - fields["MemFree"]) / 1024


# --- the HTTP API --------------------------------------------------------------------------------------------------


# --- the measurements ----------------------------------------------------------------------------------------------


@dataclass
class Kept:
    """The last 512 MiB sandbox and its snapshot, kept for the restore and fork-tree steps."""

    sandbox_id: str
    snapshot_id: str


def capture_breakdown(manifest: dict[str, Any]) -> dict[str, float]:
    """The server's own timing of a capture (``capture`` in the snapshot's ``manifest.json``), numbers only."""
    capture = manifest.get("capture") or {}
    return {k: float(capture[k]) for k in CAPTURE_FIELDS if isinstance(capture.get(k), int | float)}


def _read_capture(paths: Paths, snapshot_id: str, modes: list[str] | None = None) -> dict[str, float]:
    """The capture's timing; its ``mode`` (background, precopy, stopped) is appended to ``modes``."""
    manifest = read_manifest(paths, snapshot_id)
    if modes is not None:
        modes.append(str((manifest.get("capture") or {}).get("mode", "unknown")))
    return capture_breakdown(manifest)


def _pause_runs(
    api: Api,
    paths: Paths,
    template: str,
    n: int,
    pauses: list[float],
    walls: list[float],
    captures: list[dict[str, float]],
    sizes: list[float] | None,
    keep: bool,
    modes: list[str] | None = None,
) -> Kept | None:
    kept = None
    for i in range(n):
        sbx = api.create({"template": template})
        api.exec(sbx["id"], DIRTY_CMD)
        started = time.monotonic()
        snap = api.snapshot(sbx["id"])
        walls.append(ms_since(started))
        if snap.get("pause_ms") is None:
            raise BenchError(f"snapshot {snap['id']} of {sbx['id']} has no pause_ms: {snap}")
        pauses.append(float(snap["pause_ms"]))
        captures.append(_read_capture(paths, snap["id"], modes))
        if sizes is not None:
            sizes.append(float(snap["size_bytes"]))
        if keep and i == n - 1:
            kept = Kept(sbx["id"], snap["id"])
        else:
            api.delete_snapshot(snap["id"])
            api.delete_sandbox(sbx["id"])
    return kept


def _restore_runs(api: Api, snapshot_id: str, n: int, s: Samples) -> None:
    for _ in range(n):
        started = time.monotonic()
        sbx = api.create({"from_snapshot": snapshot_id})
        created = time.monotonic()
        api.exec(sbx["id"], "true")
        s.restore_total.append(ms_since(started))
        s.restore_call.append((created - started) * 1000)
        s.restore_first_exec.append(ms_since(created))
        s.restore_boot.append(float(sbx["boot_ms"]))
        api.delete_sandbox(sbx["id"])


def _fork_tree(api: Api, parent_id: str, run_dir: Path, paths: Paths, s: Samples) -> None:
    before = set(find_own_qemus(run_dir))
    started = time.monotonic()
    tree = api.fork_tree(parent_id, TREE_COUNT)
    s.tree_call_ms = ms_since(started)
    if tree["errors"] or len(tree["children"]) != TREE_COUNT:
        raise BenchError(f"fork-tree made {len(tree['children'])} of {TREE_COUNT} children; errors: {tree['errors']}")

    def first_exec(child_id: str) -> float:
        api.exec(child_id, "true")
        return ms_since(started)

    with ThreadPoolExecutor(max_workers=TREE_COUNT) as pool:
        s.tree_child_ready_ms = list(pool.map(first_exec, [c["id"] for c in tree["children"]]))
    s.tree_total_ms = max(s.tree_child_ready_ms)
    s.tree_child_boot = [float(c["boot_ms"]) for c in tree["children"]]

    pids = sorted(set(find_own_qemus(run_dir)) - before)
    if len(pids) != TREE_COUNT:
        raise BenchError(f"found {len(pids)} new QEMU processes under {run_dir} after the fork-tree, expected 16")
    s.pss_children_mib = [sum_mib([pid]) for pid in pids]
    s.rss_children_mib = [sum_mib([pid], "Rss") for pid in pids]
    s.pss_shmem_children_mib = [sum_mib([pid], "Pss_Shmem") for pid in pids]
    snap_id = tree["snapshot_id"]
    hot = paths.hot_dir / snap_id / "memory"
    try:
        ram = [smaps_mapping_kib(pid, hot) for pid in pids]
    except RuntimeError as err:
        raise BenchError(f"guest RAM mapping of a fork-tree child: {err}") from err
    s.pss_ram_children_mib = [r["Pss"] / 1024 for r in ram]
    s.cow_ram_children_mib = [r.get("Anonymous", 0) / 1024 for r in ram]
    memory = paths.snapshots_dir / snap_id / "memory"
    try:
        s.snapshot_memory_bytes = allocated_bytes(memory)
    except OSError as err:
        raise BenchError(f"cannot stat the fork-tree snapshot's memory image {memory}: {err}") from err
    s.hot_copy_bytes = allocated_bytes(hot) if hot.exists() else None


def _in_parallel(fn: Callable[[str], None], items: list[str]) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fn, items))


def qemu_version(binary: str | None = None) -> str:
    """The first line of ``--version`` of ``binary`` (default: the one this process's agent would run)."""
    try:
        return qemu_binary.version_line_of(binary or qemu_binary.binary())
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def hot_dir_bytes(hot_dir: Path) -> int:
    """Bytes allocated by every file under the hot dir (0 when it does not exist)."""
    total = 0
    for path in hot_dir.rglob("*") if hot_dir.is_dir() else ():
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += allocated_bytes(path)
    return total


def _shm_after_snapshots(api: Api, paths: Paths, s: Samples) -> None:
    """Hot-dir bytes before and after :data:`SHM_SNAPSHOTS` snapshots of ``base`` sandboxes (retained, kept until
    measured; each sandbox is deleted after its snapshot, so only the images remain)."""
    s.shm_before_bytes = hot_dir_bytes(paths.hot_dir)
    snaps = []
    for _ in range(SHM_SNAPSHOTS):
        sbx = api.create({"template": "base"})
        api.exec(sbx["id"], DIRTY_CMD)
        snaps.append(api.snapshot(sbx["id"], retain=True)["id"])
        api.delete_sandbox(sbx["id"])
    s.shm_after_bytes = hot_dir_bytes(paths.hot_dir)
    for snap in snaps:
        api.delete_snapshot(snap)


def measure_lazy(api: Api, n: int, paths: Paths, console: Console, s: Samples, progress: Reporter) -> None:
    """Snapshots of sandboxes whose RAM is paged lazily (the server runs with ``--memory lazy``)."""
    phase = progress.phase("lazy snapshots", n)
    for _ in range(n):
        sbx = api.create({"template": "base"})
        api.exec(sbx["id"], DIRTY_CMD)
        snap = api.snapshot(sbx["id"])
        if snap.get("pause_ms") is None:
            raise BenchError(f"snapshot {snap['id']} of lazily paged {sbx['id']} has no pause_ms: {snap}")
        s.lazy_pause.append(float(snap["pause_ms"]))
        s.lazy_capture.append(_read_capture(paths, snap["id"], s.capture_modes.setdefault("lazy", [])))
        api.delete_snapshot(snap["id"])
        api.delete_sandbox(sbx["id"])
        phase.advance()
    phase.finish()
    console.print(f"  lazy pause p50 {stats(s.lazy_pause)['p50']} ms")


def measure(api: Api, n: int, paths: Paths, console: Console, progress: Reporter) -> Samples:
    s = Samples()
    stages = progress.phase("stages: template, pause 512, pause 2048, restore, fork-tree, sweep, hot dir", 7)
    console.print(f"building/locating template {BIG_TEMPLATE} ({BIG_MEMORY_MB} MiB)")
    api.build_template(BIG_TEMPLATE, BIG_MEMORY_MB, console)
    stages.advance()

    console.print(f"pause window, base (512 MiB), {n} sandboxes dirtying {DIRTY_MIB} MiB each")
    kept = _pause_runs(
        api,
        paths,
        "base",
        n,
        s.pause_512,
        s.snapshot_wall_512,
        s.capture_512,
        s.snapshot_size_512,
        keep=True,
        modes=s.capture_modes.setdefault("512", []),
    )
    assert kept is not None
    console.print(
        f"  pause p50 {stats(s.pause_512)['p50']} ms, snapshot call p50 {stats(s.snapshot_wall_512)['p50']} ms"
    )
    stages.advance()
    console.print(f"pause window, {BIG_TEMPLATE} ({BIG_MEMORY_MB} MiB), {n} sandboxes")
    _pause_runs(
        api,
        paths,
        BIG_TEMPLATE,
        n,
        s.pause_2048,
        s.snapshot_wall_2048,
        s.capture_2048,
        None,
        keep=False,
        modes=s.capture_modes.setdefault("2048", []),
    )
    console.print(
        f"  pause p50 {stats(s.pause_2048)['p50']} ms, snapshot call p50 {stats(s.snapshot_wall_2048)['p50']} ms"
    )
    stages.advance()

    n_restore = max(n, MIN_RESTORES)
    console.print(f"restore from {kept.snapshot_id}, {n_restore} times")
    _restore_runs(api, kept.snapshot_id, n_restore, s)
    console.print(
        f"  restore+exec p50 {stats(s.restore_total)['p50']} ms "
        f"(create call {stats(s.restore_call)['p50']} ms, first exec {stats(s.restore_first_exec)['p50']} ms)"
    )
    stages.advance()

    s.guest_used_mib = guest_used_mib(api.exec(kept.sandbox_id, "cat /proc/meminfo")["stdout"])
    console.print(f"fork-tree of {kept.sandbox_id}, {TREE_COUNT} children")
    _fork_tree(api, kept.sandbox_id, paths.run_dir, paths, s)
    console.print(f"  fork-tree to all answered {s.tree_total_ms:.0f} ms (call {s.tree_call_ms:.0f} ms)")
    children = [sid for sid in api.sandboxes if sid != kept.sandbox_id]
    _in_parallel(api.delete_sandbox, children)
    api.delete_snapshot(kept.snapshot_id)
    api.delete_sandbox(kept.sandbox_id)
    stages.advance()

    console.print(f"dirty sweep, {BIG_TEMPLATE}: {', '.join(map(str, SWEEP_MIB))} MiB, {SWEEP_REPS} sandboxes each")
    dirty_sweep(api, paths, s, console)
    stages.advance()
    console.print(f"hot dir after {SHM_SNAPSHOTS} snapshots of base sandboxes")
    _shm_after_snapshots(api, paths, s)
    assert s.shm_before_bytes is not None and s.shm_after_bytes is not None
    console.print(f"  {s.shm_before_bytes / _MIB:.0f} -> {s.shm_after_bytes / _MIB:.0f} MiB")
    stages.advance()
    stages.finish()
    return s


def _run_one(
    binary: str, *, n: int, cache_dir: Path | None, console: Console, progress: Reporter, tmp: Path, label: str
) -> dict[str, Any]:
    """Everything measured with ``binary``: a hot server (pause, restore, fork-tree, sweep, hot dir), then a
    lazy one (lazy pause). Both get ``CRYOBOX_QEMU=binary`` (empty: the system's)."""
    version = qemu_version(binary)
    env = {qemu_binary.ENV_QEMU: "" if binary == qemu_binary.QEMU_BINARY else binary}
    cache = (cache_dir or DEFAULT_CACHE_DIR).resolve()
    data_dir = tmp / f"data-{label}"
    console.print(f"[bold]{version}[/] ({binary}): starting cryobox serve (prespawn 0)")
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_env=env, extra_args=HOT_ARGS) as server:
        paths = Paths(data_dir.resolve(), cache)
        with api_session(server.url, server.api_key, console) as api:
            info = api.call("GET", "/v1/info", 200)
            samples = measure(api, n, paths, console, progress)

    lazy_dir = tmp / f"lazy-{label}"
    console.print(f"{version}: lazy server (--memory lazy), {n} snapshots of lazily paged base sandboxes")
    with ServeProcess(lazy_dir, cache_dir=cache_dir, prespawn=0, extra_env=env, extra_args=LAZY_ARGS) as server:
        paths = Paths(lazy_dir.resolve(), cache)
        with api_session(server.url, server.api_key, console) as api:
            measure_lazy(api, n, paths, console, samples, progress)

    return build_result(
        samples,
        n=n,
        cores=os.cpu_count() or 0,
        accelerator=str(info["accelerator"]),
        qemu=version,
        server_version=str(info["version"]),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        qemu_path=binary,
    )


def binaries_to_run(extra: list[str], default: str | None = None) -> list[str]:
    """The default binary (``CRYOBOX_QEMU`` or the system's) first, then each ``--qemu`` not already listed.

    :raises BenchError: a ``--qemu`` path is no usable QEMU binary.
    """
    out = [default or qemu_binary.binary()]
    for path in extra:
        try:
            resolved = qemu_binary.resolve_binary(path)
        except CryoboxError as err:
            raise BenchError(f"--qemu {path}: {err.message}") from err
        if resolved not in out:
            out.append(resolved)
    return out


def run_snapshot_bench(
    *,
    n: int,
    out_dir: Path,
    cache_dir: Path | None,
    console: Console,
    progress: Reporter,
    qemus: list[str] | None = None,
) -> dict[str, Any]:
    if n < 1:
        raise BenchError("--n must be at least 1")
    binaries = binaries_to_run(list(qemus or []))
    results = []
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-snap-") as tmp:
        for index, binary in enumerate(binaries):
            one = _run_one(
                binary, n=n, cache_dir=cache_dir, console=console, progress=progress, tmp=Path(tmp), label=str(index)
            )
            results.append(one)
            console.print(result_table(results[-1]))
    result = combine_results(results)
    out = write_result(out_dir, "snapshot", result)
    if len(binaries) > 1:
        console.print(comparison_table(result))
    console.print(f"written to {out}")
    return result
