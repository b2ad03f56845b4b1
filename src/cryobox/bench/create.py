"""``cryobox bench create``: cold boot vs bare restore vs API create, each measured to the first exec
answered, on the same template in one run.

- cold boot: a fresh QEMU booting the template's kernel and disk (what a bake does), until ``exec true``
  is answered.
- bare restore: the benchmark itself spawns a plain QEMU on the template's files (``-incoming defer``,
  memory ``share=off``, ``migrate-incoming``, ``cont``) without the platform, from process start until
  ``exec true`` is answered.
- create: SDK ``Sandbox.create`` against a real ``cryobox serve`` until ``exec true`` is answered, with the
  default warm pool, and (for comparison, same run) a pool of QEMUs only spawned, and no pool at all.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from ..agent.guest.exec import run_exec
from ..agent.host.startup import HostConfig, prepare_templates
from ..agent.templates.bake import Template
from ..agent.vm import MemoryBacking, MicroVM, VmPaths
from ..config import Paths
from ..image.specs import BUILTIN_TEMPLATES
from ..sdk.sandbox import Sandbox
from ..util.progress import Reporter
from .report import write_result
from .server import ServeProcess
from .stats import stats

# (label, pre-spawned VMs per template, pool mode): the default first, then what each layer buys
POOL_VARIANTS = (("warm_pool", 2, "warm"), ("spawned_pool", 2, "spawned"), ("no_pool", 0, "spawned"))
REFILL_PAUSE_S = 1.0  # between sequential creates, as between real requests: the pool refills


async def _cold_boot(template: Template, work: Path, i: int) -> float:
    paths = VmPaths(work / f"cold{i}")
    paths.root.mkdir(parents=True)
    rootfs = template.manifest["rootfs"]
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", rootfs, str(paths.disk)], check=True)
    memory = paths.root / "memory"
    with open(memory, "wb") as fh:
        fh.truncate(template.machine.memory_mib << 20)
    vm = MicroVM(f"cold{i}", template.machine, paths, MemoryBacking(memory, share=True), paths.disk)
    started = time.monotonic()
    try:
        await vm.start(incoming=False)
        await vm.wait_guest_ready(300)
        await run_exec(await vm.connect_guest(), "true")
        return (time.monotonic() - started) * 1000
    finally:
        await vm.kill()
        shutil.rmtree(paths.root, ignore_errors=True)


async def _bare_restore(template: Template, work: Path, i: int) -> float:
    paths = VmPaths(work / f"bare{i}")
    paths.root.mkdir(parents=True)
    started = time.monotonic()
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(template.disk), str(paths.disk)],
        check=True,
    )
    vm = MicroVM(f"bare{i}", template.machine, paths, MemoryBacking(template.memory, share=False), paths.disk)
    try:
        await vm.start(incoming=True)
        guest = await vm.connect_guest()
        await vm.restore(template.vmstate)
        await run_exec(guest, "true")
        return (time.monotonic() - started) * 1000
    finally:
        await vm.kill()
        shutil.rmtree(paths.root, ignore_errors=True)


def _api_create(server: ServeProcess, template: str) -> tuple[float, float, float]:
    """(create+first exec, create call alone, server-side boot_ms)."""
    started = time.monotonic()
    sbx = Sandbox.create(template=template, api_url=server.url, api_key=server.api_key)
    created = time.monotonic()
    try:
        sbx.exec("true")
        done = time.monotonic()
    finally:
        sbx.kill()
    return (done - started) * 1000, (created - started) * 1000, sbx.info.boot_ms


async def run_create_bench(
    *,
    n: int,
    template: str,
    out_dir: Path,
    cache_dir: Path | None,
    console: Console,
    progress: Reporter,
    cold_n: int = 5,
) -> dict[str, Any]:
    specs = tuple(s for s in BUILTIN_TEMPLATES if s.name == template)
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-") as tmp:
        work = Path(tmp)
        paths = Paths.from_env(work / "data", cache_dir)
        config = HostConfig(paths=paths, templates=specs)
        tmpl = (await prepare_templates(config, progress))[template]

        cold: list[float] = []
        with progress.phase("cold boots", cold_n) as phase:
            for i in range(cold_n):
                cold.append(await _cold_boot(tmpl, work, i))
                console.print(f"cold boot {i + 1}/{cold_n}: {cold[-1]:.0f} ms")
                phase.advance()
        bare: list[float] = []
        with progress.phase("bare restores", n) as phase:
            for i in range(n):
                bare.append(await _bare_restore(tmpl, work, i))
                phase.advance()
        console.print(f"bare restore p50 {stats(bare)['p50']:.0f} ms")
        runs: dict[str, dict[str, list[float]]] = {}
        for label, prespawn, mode in POOL_VARIANTS:
            samples: dict[str, list[float]] = {"total": [], "call": [], "boot": [], "first_exec": []}
            serve_dir = work / f"serve-{label}"
            with (
                ServeProcess(serve_dir, cache_dir=cache_dir, prespawn=prespawn, pool_mode=mode) as server,
                progress.phase(f"creates ({label})", n) as phase,
            ):
                await asyncio.sleep(3.0)  # let the pool fill before the first sample
                for _ in range(n):
                    total, call, boot_ms = await asyncio.to_thread(_api_create, server, template)
                    samples["total"].append(total)
                    samples["call"].append(call)
                    samples["boot"].append(boot_ms)
                    samples["first_exec"].append(total - call)
                    phase.advance()
                    await asyncio.sleep(REFILL_PAUSE_S)
            runs[label] = samples
            console.print(
                f"create ({label}) p50 {stats(samples['total'])['p50']:.0f} ms "
                f"(create call {stats(samples['call'])['p50']:.0f} ms, "
                f"first exec {stats(samples['first_exec'])['p50']:.0f} ms)"
            )
        create = runs["warm_pool"]["total"]

    result: dict[str, Any] = {
        "n": n,
        "n_cold": cold_n,
        "template": template,
        "accelerator": tmpl.machine.accel.value,
        "cold_boot_ms": stats(cold),
        "bare_restore_ms": stats(bare),
        "create_ms": stats(create),
        "create_call_ms": stats(runs["warm_pool"]["call"]),
        "first_exec_after_create_ms": stats(runs["warm_pool"]["first_exec"]),
        "server_boot_ms": stats(runs["warm_pool"]["boot"]),
        "variants": {
            label: {
                "create_ms": stats(samples["total"]),
                "create_call_ms": stats(samples["call"]),
                "first_exec_after_create_ms": stats(samples["first_exec"]),
                "server_boot_ms": stats(samples["boot"]),
            }
            for label, samples in runs.items()
        },
        "ratio_cold_over_create": round(stats(cold)["p50"] / stats(create)["p50"], 2),
        "ratio_create_over_bare": round(stats(create)["p50"] / stats(bare)["p50"], 2),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = write_result(out_dir, "create", result)
    console.print(
        f"cold/create = {result['ratio_cold_over_create']}x, create/bare = "
        f"{result['ratio_create_over_bare']}x; written to {out}"
    )
    return result
