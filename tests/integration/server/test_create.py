"""Create = restore: sequential and concurrent creates, isolation, clock, the default template."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cryobox import Sandbox
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import detect_accel
from cryobox.bench.server import ServeProcess
from tests.support.serve import Api


def test_create_is_a_restore(sandbox: Sandbox, server: ServeProcess) -> None:
    assert sandbox.info.boot_mode == "restore"
    assert sandbox.info.status == "running"
    assert sandbox.info.memory_mb == 512 and sandbox.info.cpu == 1
    info = httpx.get(f"{server.url}/v1/info", headers={"Authorization": f"Bearer {server.api_key}"}).json()
    assert info["accelerator"] == detect_accel().value
    listed = Sandbox.list(api_url=server.url, api_key=server.api_key)
    assert sandbox.id in {s.id for s in listed}


def test_twenty_sequential_creates(api: Api) -> None:
    for i in range(20):
        with Sandbox.create(template="base", **api) as sbx:
            assert sbx.exec(f"echo {i}").stdout == f"{i}\n"


def test_eight_concurrent_creates(api: Api) -> None:
    def one(i: int) -> tuple[str, str]:
        with Sandbox.create(template="base", metadata={"i": str(i)}, **api) as sbx:
            return sbx.id, sbx.exec(f"echo {i}; cat /proc/sys/kernel/random/boot_id").stdout

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert len({sbx_id for sbx_id, _ in results}) == 8
    for i, (_, out) in enumerate(results):
        assert out.startswith(f"{i}\n")


def test_two_sandboxes_of_one_template_are_isolated(api: Api) -> None:
    with Sandbox.create(template="base", **api) as a, Sandbox.create(template="base", **api) as b:
        a.filesystem.write("/root/only-in-a", "a")
        a.exec("echo a > /tmp/in-memory-a; touch /var/tmp/disk-a")
        assert not b.filesystem.exists("/root/only-in-a")
        assert b.exec("ls /tmp/in-memory-a /var/tmp/disk-a 2>&1; echo rc=$?").stdout.endswith("rc=2\n")
        assert a.filesystem.read("/root/only-in-a") == b"a"


def test_guest_clock_is_stepped_before_create_returns(api: Api, templates: dict[str, Template]) -> None:
    # The snapshot's clock must be stale enough that a missing step would fail this test.
    age = time.time() - templates["base"].created_at
    if age < 5:
        time.sleep(5 - age)
    with Sandbox.create(template="base", **api) as sbx:
        before = time.time()
        guest = float(sbx.exec("date +%s.%N").stdout)
        after = time.time()
    assert before - 1.0 <= guest <= after + 1.0, f"guest clock {guest:.3f} vs host [{before:.3f}, {after:.3f}]"


def test_code_interpreter_template_has_the_scientific_stack(api: Api) -> None:
    with Sandbox.create(**api) as sbx:  # the default template
        assert sbx.info.template == "code-interpreter"
        assert sbx.info.memory_mb == 1024
        result = sbx.exec(
            "python3 -c 'import numpy, pandas, matplotlib; print(int(numpy.arange(4).sum()), pandas.__name__)'",
            timeout_seconds=120,
        )
        assert result.stdout == "6 pandas\n", result.stderr


def test_spawned_pool_mode_also_creates_by_restore(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> None:
    """The non-default pool mode (QEMU waiting in -incoming, state loaded at create) works end to end."""
    with ServeProcess(tmp_path_factory.mktemp("spawned"), cache_dir=cache_dir, prespawn=1, pool_mode="spawned") as srv:
        for _ in range(2):
            with Sandbox.create(template="base", api_url=srv.url, api_key=srv.api_key) as sbx:
                assert sbx.info.boot_mode == "restore"
                before = time.time()
                guest = float(sbx.exec("date +%s.%N").stdout)
                assert before - 1.0 <= guest <= time.time() + 1.0
