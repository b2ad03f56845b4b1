"""``cryobox bench build``: what building your own environment costs, measured side by side in one run.

Against a real ``cryobox serve`` (its own data dir, the shared cache dir), through the SDK's ``Templates``:

1. ``first_build_s``: a Dockerfile (``FROM debian:bookworm``, COPY, a heavy RUN, ENV, WORKDIR, a start command) whose
   first step carries a fresh nonce, so nothing of it is cached: POST to ``done``;
2. ``cached_rebuild_s``: the same Dockerfile with only its last step changed: the earlier steps come from the step
   cache; ``rebuild_ratio`` = 2 / 1 (target ≤ 0.25);
3. ``create_ms``: ``n`` creates of the built template vs ``n`` of ``base``, each to its first ``exec`` answered;
   ``create_ratio`` = built p50 / base p50 (target ≤ 1.2);
4. ``busybox_first_exec_ms``: a busybox-only image (``FROM scratch`` + the host's static busybox, no libc, no
   Python): ``n`` creates, each to its first ``exec`` answered.

``--apt PKG`` adds ``apt-get install PKG`` to the heavy step (the build VM then needs the package archive: an
operator whose archive resolves inside a blocked range opts it in with ``CRYOBOX_EGRESS_ALLOW_PRIVATE``).
Everything built is deleted in ``finally``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ..sdk import Sandbox, Templates
from ..util.progress import Reporter
from .report import write_result
from .server import ServeProcess
from .snapshot import qemu_version
from .snapshot_report import BenchError
from .stats import stats

BUSYBOX = Path("/bin/busybox")
HEAVY = "python3 -m compileall -q /usr/lib/python3.11 && head -c 64M /dev/urandom > /opt/blob"


def dockerfile(nonce: str, last: str, apt: str) -> str:
    heavy = f"apt-get update && apt-get install -y --no-install-recommends {apt} && {HEAVY}" if apt else HEAVY
    return (
        "FROM debian:bookworm\n"
        f"RUN echo {nonce} > /nonce\n"
        "COPY site/ /srv/site/\n"
        f"RUN {heavy}\n"
        "ENV MODE=bench\n"
        "WORKDIR /srv/site\n"
        f"RUN {last}\n"
        'CMD ["python3", "-m", "http.server", "8080"]\n'
        "EXPOSE 8080\n"
    )


def _build(templates: Templates, name: str, text: str, context: Path | None, progress: Reporter) -> float:
    started = time.monotonic()
    build = templates.build_from_dockerfile(name, dockerfile=text, context=context)
    final = build.wait(on_log=lambda line: progress(f"  [{line.step}] {line.message[:150]}"))
    if final.status != "done":
        raise BenchError(f"building {name} failed: {final.error}")
    return time.monotonic() - started


def _creates(url: str, key: str, template: str, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.monotonic()
        with Sandbox.create(template=template, api_url=url, api_key=key) as sbx:
            result = sbx.exec("echo ready")
            samples.append((time.monotonic() - started) * 1000)
            if result.stdout != "ready\n":
                raise BenchError(f"the first exec in {template} answered {result.stdout!r}")
        time.sleep(1.0)  # as between real requests: the pool refills
    return samples


def measure(url: str, key: str, n: int, apt: str, work: Path, console: Console, progress: Reporter) -> dict[str, Any]:
    site = work / "ctx" / "site"
    site.mkdir(parents=True)
    (site / "index.html").write_text("<h1>bench</h1>\n")
    busy = work / "busy"
    busy.mkdir()
    shutil.copy2(BUSYBOX, busy / "busybox")
    nonce = uuid.uuid4().hex
    name, busy_name = f"bench-{nonce[:8]}", f"bench-busy-{nonce[:8]}"
    result: dict[str, Any] = {}
    with Templates(api_url=url, api_key=key, timeout_s=600) as templates:
        try:
            console.print("first build (nothing cached)")
            result["first_build_s"] = round(
                _build(templates, name, dockerfile(nonce, "true", apt), work / "ctx", progress), 1
            )
            console.print(f"  {result['first_build_s']} s; rebuild with only the last step changed")
            changed = dockerfile(nonce, "echo changed > /srv/site/changed.txt", apt)
            result["cached_rebuild_s"] = round(_build(templates, name, changed, work / "ctx", progress), 1)
            console.print(f"  {result['cached_rebuild_s']} s; creates from it and from base")
            built = _creates(url, key, name, n)
            base = _creates(url, key, "base", n)
            result["create_ms"] = {"built": stats(built), "base": stats(base)}
            console.print("busybox-only image")
            busy_text = (
                f"FROM scratch\nCOPY busybox /bin/busybox\n"
                f'RUN ["/bin/busybox", "--install", "-s", "/bin"]\nRUN echo {nonce} > /nonce\n'
            )
            result["busybox_build_s"] = round(_build(templates, busy_name, busy_text, busy, progress), 1)
            result["busybox_first_exec_ms"] = stats(_creates(url, key, busy_name, n))
        finally:
            for template in (name, busy_name):
                httpx.delete(f"{url}/v1/templates/{template}", headers={"Authorization": f"Bearer {key}"})
    return result


def run_build_bench(
    *, n: int, apt: str, out_dir: Path, cache_dir: Path | None, console: Console, progress: Reporter
) -> dict[str, Any]:
    if n < 1:
        raise BenchError("--n must be at least 1")
    extra = {k: v for k, v in os.environ.items() if k.startswith("CRYOBOX_EGRESS_")}
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-build-") as tmp:
        console.print("starting cryobox serve")
        with ServeProcess(Path(tmp) / "data", cache_dir=cache_dir, extra_env=extra) as server:
            figures = measure(server.url, server.api_key, n, apt, Path(tmp), console, progress)
    result: dict[str, Any] = {
        "bench": "build",
        "n": n,
        "cores": os.cpu_count() or 0,
        "qemu": qemu_version(),
        "apt": apt,
        **figures,
        "rebuild_ratio": round(figures["cached_rebuild_s"] / figures["first_build_s"], 3),
        "create_ratio": round(figures["create_ms"]["built"]["p50"] / figures["create_ms"]["base"]["p50"], 3),
        "targets": {"rebuild_ratio": 0.25, "create_ratio": 1.2},
    }
    result["path"] = str(write_result(out_dir, "build", result))
    return result
