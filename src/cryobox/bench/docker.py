"""``cryobox bench docker``: what Docker inside a sandbox costs (the built-in ``docker`` template), side by side.

Against a real ``cryobox serve --templates docker`` (the default warm pool), ``n`` times each:

1. ``create_ms``: create a ``docker`` sandbox (client wall, SDK call to answer);
2. ``first_docker_ps_ms``: its first ``docker ps`` right after (dockerd was baked alive: no daemon start);
3. ``create_to_docker_run_ms``: from a snapshot of a sandbox holding a hello-style image (``docker import`` of a
   one-binary tree made in the guest: nothing pulled), create and then ``docker run --rm`` it until its greeting
   comes back: the whole wall, and its two parts (``restore_create_ms``, ``first_docker_run_ms``);
4. ``steady_docker_run_ms``: ``docker run --rm`` of that image again and again in one warm sandbox;
5. ``exec_true_ms``: a plain ``exec("true")`` in that sandbox, for scale (what a container adds to a command).

And the template's size: its memory (MiB given, and what the bake's memory file holds on disk), its disk (the
root image and the bake's overlay, allocated), and what the guest reports right after a create (``free``,
``df /``). Everything created is deleted in ``finally``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ..config import DEFAULT_CACHE_DIR
from ..sdk import Sandbox
from ..util.progress import Reporter
from .report import write_result
from .server import ServeProcess
from .snapshot import qemu_version
from .snapshot_report import BenchError
from .stats import stats, timed

TEMPLATE = "docker"
IMAGE = "bench/hello:1"
GREETING = "hello from a container"
# a one-binary image made in the guest from its own echo and the C library it links (nothing pulled)
MAKE_IMAGE = (
    "tar -chf - -C / usr/bin/echo lib64/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/libc.so.6 | "
    f'docker import --change \'CMD ["/usr/bin/echo", "{GREETING}"]\' - {IMAGE} >/dev/null'
)
RUN = f"docker run --rm {IMAGE}"
GUEST_SIZES = "free -k | awk '/^Mem:/ {print $3}'; df -k --output=used / | tail -1; du -sk /var/lib/docker | cut -f1"
NOTES = {
    "create_ms": "create from the docker template (dockerd baked alive), SDK wall",
    "first_docker_ps_ms": "the first `docker ps` after that create",
    "create_to_docker_run_ms": "create from a snapshot holding a hello-style image, then its first `docker run --rm`",
    "steady_docker_run_ms": "`docker run --rm` of that image again and again in one sandbox",
    "exec_true_ms": "`exec('true')` in the same sandbox, for scale",
}


def _sh(sbx: Sandbox, cmd: str, timeout_s: float = 120) -> str:
    done = sbx.exec(cmd, timeout_seconds=timeout_s)
    if done.exit_code != 0:
        raise BenchError(f"{cmd!r} exited {done.exit_code}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _run_hello(sbx: Sandbox) -> None:
    out = _sh(sbx, RUN)
    if out != f"{GREETING}\n":
        raise BenchError(f"{RUN!r} printed {out!r}")


def measure(url: str, key: str, n: int, console: Console, progress: Reporter) -> dict[str, Any]:
    samples: dict[str, list[float]] = {
        name: [] for name in ("create", "ps", "restore_create", "first_run", "create_to_run", "steady_run", "exec")
    }
    guest: dict[str, float] = {}
    with progress.phase("creates", n) as phase:
        for i in range(n):
            wall, sbx = timed(lambda: Sandbox.create(template=TEMPLATE, api_url=url, api_key=key))
            try:
                ps_ms, ps = timed(partial(sbx.exec, "docker ps -q", timeout_seconds=60))
                if ps.exit_code != 0 or ps.stdout:
                    raise BenchError(f"docker ps after a create: {ps.exit_code} {ps.stdout!r} {ps.stderr!r}")
                if i == 0:
                    used_kib, disk_kib, docker_kib = (float(v) for v in _sh(sbx, GUEST_SIZES).split())
                    guest = {"memory_used_mib": used_kib / 1024, "disk_used_mib": disk_kib / 1024}
                    guest["var_lib_docker_mib"] = docker_kib / 1024
            finally:
                sbx.kill()
            samples["create"].append(wall)
            samples["ps"].append(ps_ms)
            phase.advance()
    source = Sandbox.create(template=TEMPLATE, api_url=url, api_key=key)
    try:
        _sh(source, MAKE_IMAGE)
        _run_hello(source)
        snap = source.snapshot()
        try:
            with progress.phase("create from a snapshot + docker run", n) as phase:
                for _ in range(n):
                    started = time.monotonic()
                    sbx = Sandbox.create(from_snapshot=snap.id, api_url=url, api_key=key)
                    try:
                        created = time.monotonic()
                        _run_hello(sbx)
                        done = time.monotonic()
                    finally:
                        sbx.kill()
                    samples["restore_create"].append((created - started) * 1000)
                    samples["first_run"].append((done - created) * 1000)
                    samples["create_to_run"].append((done - started) * 1000)
                    phase.advance()
        finally:
            httpx.delete(f"{url}/v1/snapshots/{snap.id}", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        with progress.phase("steady docker run", n * 2) as phase:
            for _ in range(n * 2):
                samples["steady_run"].append(timed(lambda: _run_hello(source))[0])
                samples["exec"].append(timed(lambda: _sh(source, "true"))[0])
                phase.advance()
    finally:
        source.kill()
    console.print(
        f"create {stats(samples['create'])['p50']:.0f} ms, first docker ps {stats(samples['ps'])['p50']:.0f} ms, "
        f"create→docker run {stats(samples['create_to_run'])['p50']:.0f} ms (p50)"
    )
    return {"samples": samples, "guest": guest}


def bake_sizes(cache_dir: Path, generation: str) -> dict[str, float]:
    """The docker template's bake on disk (MiB allocated): its memory file, its disk overlay and the root image."""
    bake = cache_dir / "templates" / f"{TEMPLATE}-{generation}"
    if not (bake / "manifest.json").is_file():
        raise BenchError(f"no bake of the docker template at {bake}")
    manifest = json.loads((bake / "manifest.json").read_text())

    def allocated(path: Path) -> float:
        return round(path.stat().st_blocks * 512 / 2**20, 1)

    rootfs = Path(str(manifest["rootfs"]))
    return {
        "memory_file_mib": allocated(bake / "memory"),
        "memory_file_apparent_mib": round((bake / "memory").stat().st_size / 2**20, 1),
        "disk_overlay_mib": allocated(bake / "disk.qcow2"),
        "rootfs_mib": allocated(rootfs),
        "rootfs_apparent_mib": round(rootfs.stat().st_size / 2**20, 1),
    }


def build_result(
    measured: dict[str, Any], *, n: int, qemu: str, memory_mb: int, bake: dict[str, float]
) -> dict[str, Any]:
    samples: dict[str, list[float]] = measured["samples"]
    create_to_run = stats(samples["create_to_run"])
    return {
        "bench": "docker",
        "template": TEMPLATE,
        "n": n,
        "cores": os.cpu_count() or 0,
        "qemu": qemu,
        "create_ms": stats(samples["create"]),
        "first_docker_ps_ms": stats(samples["ps"]),
        "create_to_docker_run_ms": create_to_run,
        "restore_create_ms": stats(samples["restore_create"]),
        "first_docker_run_ms": stats(samples["first_run"]),
        "steady_docker_run_ms": stats(samples["steady_run"]),
        "exec_true_ms": stats(samples["exec"]),
        "container_over_exec": round(stats(samples["steady_run"])["p50"] / max(stats(samples["exec"])["p50"], 0.1), 1),
        "template_memory_mb": memory_mb,
        "bake": bake,
        "guest_after_create": {k: round(v, 1) for k, v in measured["guest"].items()},
        "notes": NOTES,
    }


def run_docker_bench(
    *, n: int, out_dir: Path, cache_dir: Path | None, console: Console, progress: Reporter
) -> dict[str, Any]:
    if n < 1:
        raise BenchError("--n must be at least 1")
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-docker-") as tmp:
        console.print("starting cryobox serve --templates docker (bakes the template on its first run)")
        with ServeProcess(Path(tmp) / "data", cache_dir=cache_dir, extra_args=["--templates", TEMPLATE]) as server:
            template = httpx.get(
                f"{server.url}/v1/templates/{TEMPLATE}", headers={"Authorization": f"Bearer {server.api_key}"}
            ).json()
            measured = measure(server.url, server.api_key, n, console, progress)
    bake = bake_sizes(cache_dir or DEFAULT_CACHE_DIR, str(template["generation"]))
    result = build_result(measured, n=n, qemu=qemu_version(), memory_mb=int(template["memory_mb"]), bake=bake)
    result["path"] = str(write_result(out_dir, "docker", result))
    return result
