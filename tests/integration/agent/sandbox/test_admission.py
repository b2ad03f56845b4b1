"""50 concurrent creates against an admission limit of 4 (queue 8): some are refused with 503 + Retry-After,
never more than 4 restore at once (counted by the agent's restore path, independently of admission), and
nothing is leaked. Without admission the same burst runs dozens of restores at once and refuses none."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from cryobox.bench.stats import stats


def test_fifty_concurrent_creates_with_admission_limit_of_four(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path_factory.mktemp("adm")
    args = ["--max-concurrent-restores", "4", "--admission-queue", "8", "--admission-timeout", "20"]
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=2, extra_args=args) as srv:
        headers = {"Authorization": f"Bearer {srv.api_key}"}

        def create(i: int) -> tuple[int, float, httpx.Response]:
            started = time.monotonic()
            response = httpx.post(
                f"{srv.url}/v1/sandboxes",
                json={"template": "base", "metadata": {"i": str(i)}},
                headers=headers,
                timeout=120,
            )
            return response.status_code, (time.monotonic() - started) * 1000, response

        with ThreadPoolExecutor(50) as pool:
            results = list(pool.map(create, range(50)))
        statuses = [status for status, _, _ in results]
        assert set(statuses) <= {201, 503}, statuses
        created = [r.json()["id"] for status, _, r in results if status == 201]
        refused = [r for status, _, r in results if status == 503]
        assert created, "some creates must be admitted"
        # 50 at once against 4 slots + 8 queued: the rest must have been refused, before anything was created
        # (38 arrive while 4 restore and 8 wait; some slots free up while the burst is still arriving)
        assert len(refused) >= 10, statuses
        peak = httpx.get(f"{srv.url}/v1/info", headers=headers).json()["capacity"]["restores_peak"]
        assert 1 <= peak <= 4, f"{peak} restores ran at once; the admission limit is 4"
        for response in refused:
            assert int(response.headers["Retry-After"]) >= 1
            body = response.json()
            assert body["code"] == "capacity" and body["error"]
        ok_ms = [ms for status, ms, _ in results if status == 201]
        print(
            f"\n50 concurrent creates, limit 4: {len(created)} created, {len(refused)} refused (503); "
            f"create ms {stats(ok_ms)}"
        )

        listed = httpx.get(f"{srv.url}/v1/sandboxes", headers=headers).json()["items"]
        assert sorted(s["id"] for s in listed) == sorted(created), "a refused create must leave no sandbox"
        for sandbox_id in created:
            assert httpx.delete(f"{srv.url}/v1/sandboxes/{sandbox_id}", headers=headers).status_code == 204
        assert httpx.get(f"{srv.url}/v1/sandboxes", headers=headers).json()["items"] == []
        deadline = time.monotonic() + 30  # the pools refill in the background; wait until they settle
        while True:
            leftover = find_own_qemus(data_dir / "vol" / "run")
            capacity = httpx.get(f"{srv.url}/v1/info", headers=headers).json()["capacity"]
            if len(leftover) == capacity["prespawned_vms"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert capacity["sandboxes_running"] == 0
        # what remains is exactly the pre-spawn pools (2 per template), nothing from the burst
        assert len(leftover) == capacity["prespawned_vms"] <= 2 * len(templates)
        metrics = httpx.get(f"{srv.url}/metrics", headers=headers).text
        assert f'cryobox_creates_total{{boot_mode="restore",result="refused"}} {float(len(refused))}' in metrics
    assert find_own_qemus(data_dir / "vol" / "run") == []
