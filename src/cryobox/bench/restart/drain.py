"""Phase 4 of ``cryobox bench restart``: drain one agent of a fleet of two (PostgreSQL, moto, ``cryobox control``,
two ``cryobox agent`` in network namespaces of their own).

``a1`` is stopped while ``drain_n`` sandboxes are created, so all of them land on ``a0``; each starts a background
process; ``a1`` comes back; ``POST /v1/agents/a0/drain`` hibernates every sandbox of ``a0`` into the object store.
Then one exec per sandbox (it wakes elsewhere, on its first request) checks its background process: the drain's
seconds per sandbox (from its answer), each first exec's seconds, and where each sandbox ended up. A drain route that
answers 404/405 (not built yet) is recorded as ``{"error": ...}``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ...errors import CryoboxError
from ..fleet_result import host_to_agent
from ..fleetproc import Fleet
from ..hop import checked
from .analysis import drain_summary
from .api import Api, check_background_cmd

SOURCE, OTHER = "a0", "a1"


def _first_exec(api: Api, sandbox_id: str, process: tuple[int, str], view: dict[str, Any]) -> dict[str, Any]:
    pid, started = process
    sample: dict[str, Any] = {"id": sandbox_id, "ok": False}
    t0 = time.monotonic()
    try:
        lines = api.exec(sandbox_id, check_background_cmd(pid), timeout_s=300)["stdout"].split()
        sample.update(ok=True, process_alive=lines == [started, "sleep"])
    except (CryoboxError, httpx.HTTPError) as err:
        sample["error"] = str(err)[:300]
    sample["seconds"] = round(time.monotonic() - t0, 3)
    try:
        body = api.get(sandbox_id)
        sample.update(host=host_to_agent(body.get("host"), view), status=body.get("status"))
    except (CryoboxError, httpx.HTTPError) as err:
        sample["host"] = f"? ({str(err)[:100]})"
    return sample


def run_drain(root: Path, *, n: int, template: str, cache_dir: Path | None, console: Console) -> dict[str, Any]:
    fleet = Fleet(
        root / "drain",
        agents=2,
        cache_dir=cache_dir,
        isolation="netns",
        template_source="build",
        memory="hot",
        templates=(template,),
        prespawn=1,
        net_pool=min(n + 2, 16),
    )
    with fleet:
        console.print(f"[bold]drain[/bold]: {n} sandboxes on {SOURCE} (fleet of 2, {OTHER} stopped meanwhile)")
        fleet.agents[OTHER].stop()
        fleet.wait_agent_not_up(OTHER, timeout_s=fleet.agent_deadline_s * 6 + 30)
        processes: dict[str, tuple[int, str]] = {}
        with Api(fleet.url, fleet.api_key, timeout_s=900) as api:
            view = fleet.agents_view()
            for _ in range(n):
                body = api.create(template)
                if host_to_agent(body.get("host"), view) != SOURCE:
                    raise RuntimeError(f"sandbox {body['id']} landed on {body.get('host')}, not {SOURCE}")
                processes[str(body["id"])] = api.start_background(str(body["id"]))
            fleet.agents[OTHER].start()
            t0 = time.monotonic()
            response = api.client.post(f"/v1/agents/{SOURCE}/drain", timeout=1800)
            wall = round(time.monotonic() - t0, 3)
            if response.status_code in (404, 405):
                return {"error": f"drain route answered {response.status_code}: {response.text[:200]}"}
            answer = checked(response, "drain")
            console.print(f"  drained in {wall} s: {answer.get('count')} sandbox(es); first exec of each")
            view = fleet.agents_view()
            wakes = [_first_exec(api, sandbox_id, process, view) for sandbox_id, process in processes.items()]
    return {**drain_summary(answer, wakes, SOURCE), "drain_wall_s": wall, "n": n}
