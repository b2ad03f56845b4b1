"""``cryobox bench volume``: what attaching volumes adds to a create, measured on an in-process host agent.

A host agent (:func:`~cryobox.agent.host.startup.start_host`, the ``base`` template, its pre-spawn pool) makes
``n`` rounds of creates, each round one create per variant in turn: no volume, one read-write volume, one read-only
volume, one of each. Each create waits for the pool to be full again first (so every one takes a prepared VM, as
between real requests) and is timed from the call to the answer of its first ``exec`` (``create_to_first_exec_ms``:
what a caller waits for); the sandbox is then deleted (its volumes settled). Volumes are 64 MiB ext4 images made
once for the run. ``added_ms`` is each variant's p50 minus the no-volume p50. Then ``io``: sequential and 4 KiB
random reads and writes in the guest on a 1 GiB volume against its root disk (:mod:`.volumeio`); then
``detach_upload``: storing a 1 GiB volume again after 10 % of it changed (:mod:`.volume_upload`, no VM).

:func:`measure` is what ``cryobox bench volume`` calls; it returns the result (and writes it under ``out_dir``).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..agent.guest.exec import ExecSpec, run_exec
from ..agent.host.startup import HostConfig, start_host
from ..agent.sandbox.pool import PoolMode
from ..agent.vm.volumes import VolumeAttach
from ..agent.volumes.store import VolumeStore
from ..agentapi.models_volumes import VolumeSpec
from ..config import Paths
from ..image.specs import BASE
from . import volume_upload, volumeio
from .report import write_result
from .server import release_serve_state
from .stats import stats

VOLUME_BYTES = 64 << 20
POOL = 2
SETTLE_S = 0.5  # between creates, as between real requests (the pool refills, the host goes idle)
IO_VOLUME_BYTES = 1 << 30
IO_VOLUME_ID = "vol-00000000b10e"
IO_FILE_MIB = 256
IO_OPS = 2000
IO_RUNS = 3
ROOT_DIR = "/var/tmp"  # on the sandbox's root disk (not a tmpfs)


def make_ext4(path: Path, size_bytes: int, label: str, content: Path | None = None) -> Path:
    """A raw image of ``size_bytes`` holding an ext4 filesystem labelled ``label`` (at most 16 bytes), with the
    files of the directory ``content`` if given (``mkfs.ext4 -d``: no mount)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size_bytes)
    extra = ["-d", str(content)] if content is not None else []
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, *extra, str(path)], check=True, capture_output=True)
    return path


def variants(volumes_dir: Path) -> dict[str, tuple[VolumeAttach, ...]]:
    rw = make_ext4(volumes_dir / "bench-rw.ext4", VOLUME_BYTES, "bench-rw")
    ro = make_ext4(volumes_dir / "bench-ro.ext4", VOLUME_BYTES, "bench-ro")
    write = VolumeAttach(rw, mount_path="/mnt/rw", name="bench-rw")
    read = VolumeAttach(ro, read_only=True, mount_path="/mnt/ro", name="bench-ro")
    return {"none": (), "rw": (write,), "ro": (read,), "rw_ro": (write, read)}


async def _full(pool_ready: Callable[[], int], want: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while pool_ready() < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pre-spawn pool did not refill to {want} in {timeout:.0f}s")
        await asyncio.sleep(0.05)


async def run(
    data_dir: Path,
    cache_dir: Path,
    n: int = 20,
    pool_mode: PoolMode = PoolMode.WARM,
    progress: Callable[[str], None] = print,
    io_runs: int = IO_RUNS,
) -> dict[str, Any]:
    """``n`` rounds of the four variants on a fresh host agent on ``data_dir``, then (``io_runs`` > 0) the in-guest
    I/O of :mod:`.volumeio`; the samples' summary."""
    config = HostConfig(
        paths=Paths(data_dir=data_dir, cache_dir=cache_dir),
        prespawn=POOL,
        pool_mode=pool_mode,
        net_pool=POOL + 2,
        templates=(BASE,),
    )
    host = await start_host(config, progress)
    samples: dict[str, list[float]] = {}
    try:
        cases = variants(config.paths.volume_dir / "volumes")
        service, pool = host.service, host.service.pools[BASE.name]
        for _ in range(n):
            for label, volumes in cases.items():
                await _full(lambda: pool.ready_count, POOL)
                await asyncio.sleep(SETTLE_S)
                started = time.monotonic()
                sandbox = await service.create(BASE.name, volumes=volumes)
                try:
                    result = await run_exec(await sandbox.vm.connect_guest(), "true")
                    samples.setdefault(label, []).append((time.monotonic() - started) * 1000)
                    if result.exit_code != 0:
                        raise RuntimeError(f"first exec failed: {result.stderr}")
                finally:
                    await service.delete(sandbox.id)
        io = await _io(service, config.paths.volume_dir / "volumes", progress, io_runs) if io_runs else None
    finally:
        await host.close()
        release_serve_state(data_dir, cache_dir)  # the owner record a stopped agent leaves for `cryobox gc`
    summary = {label: stats(values) for label, values in samples.items()}
    base = summary["none"]["p50"]
    return {
        "n": n,
        "template": BASE.name,
        "pool_mode": pool_mode.value,
        "accelerator": config.accel.value,
        "volume_bytes": VOLUME_BYTES,
        "create_to_first_exec_ms": summary,
        "added_ms": {label: round(s["p50"] - base, 1) for label, s in summary.items() if label != "none"},
        "io": io,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


async def _io(service: Any, volumes_dir: Path, progress: Callable[[str], None], n_runs: int) -> dict[str, Any]:
    """:mod:`.volumeio` in one sandbox with a 1 GiB read-write volume, alternating volume and root disk."""
    store = VolumeStore(volumes_dir)  # made as the agent makes a volume's image: allocated in full, ext4
    await store.create(VolumeSpec(volume_id=IO_VOLUME_ID, size_bytes=IO_VOLUME_BYTES, label="bench-io"))
    image = store.path(IO_VOLUME_ID)
    sandbox = await service.create(BASE.name, volumes=(VolumeAttach(image, mount_path="/mnt/io", name="bench-io"),))
    runs: dict[str, list[dict[str, float]]] = {"volume": [], "root": []}
    try:
        guest = await sandbox.vm.connect_guest()
        for _ in range(n_runs):
            for where, directory in (("volume", "/mnt/io"), ("root", ROOT_DIR)):
                cmd = volumeio.command(f"{directory}/bench.io", IO_FILE_MIB, IO_OPS)
                spec = ExecSpec(cmd=cmd, stdin=volumeio.PROGRAM.encode(), user="root", timeout_s=600)
                result = await run_exec(guest, spec)
                if result.exit_code != 0:
                    raise RuntimeError(f"I/O run on {where} failed: {result.stderr[-500:]}")
                runs[where].append(volumeio.parse(result.stdout))
                progress(f"io {where}: {runs[where][-1]}")
    finally:
        await service.delete(sandbox.id)
        image.unlink(missing_ok=True)
    return {"file_mib": IO_FILE_MIB, "ops": IO_OPS, **volumeio.summary(runs["volume"], runs["root"])}


async def measure(
    data_dir: Path,
    cache_dir: Path,
    out_dir: Path,
    n: int = 20,
    pool_mode: PoolMode = PoolMode.WARM,
    progress: Callable[[str], None] = print,
    io_runs: int = IO_RUNS,
    upload: bool = True,
) -> dict[str, Any]:
    """:func:`run` (and, with ``upload``, :mod:`.volume_upload`'s detach-upload of 1 GiB with 10 % changed), its
    result written to ``out_dir`` as ``volume-<time>.json``; ``progress`` gets the host's start-up lines (the CLI
    sends them to stderr: stdout is the JSON)."""
    result = await run(data_dir, cache_dir, n, pool_mode, progress, io_runs)
    if upload:  # no VM: a 1 GiB image stored, 10 % of it rewritten, stored again (what a move's source uploads)
        progress("detach-upload: 1 GiB, 10 % rewritten in 4 MiB and in 1 MiB writes")
        result["detach_upload"] = {
            "4MiB writes": await asyncio.to_thread(volume_upload.measure),
            "1MiB writes": await asyncio.to_thread(volume_upload.measure, block=1 << 20),
        }
    write_result(out_dir, "volume", result)
    return result
