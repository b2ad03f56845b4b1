"""Placement on a real server: capacity is reserved when a create is decided, so a burst larger than the host
gets clean 503s for the excess instead of overcommitting, and deleting a sandbox frees its place."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.serve import Client


def test_burst_beyond_host_capacity_is_refused_cleanly(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    args = ["--max-sandboxes", "3", "--templates", "base"]
    with ServeProcess(tmp_path / "p", cache_dir=cache_dir, prespawn=1, extra_args=args) as serve:

        async def burst() -> list[httpx.Response]:
            headers = {"Authorization": f"Bearer {serve.api_key}"}
            async with httpx.AsyncClient(base_url=serve.url, headers=headers, timeout=300) as http:
                return await asyncio.gather(*(http.post("/v1/sandboxes", json={"template": "base"}) for _ in range(6)))

        responses = asyncio.run(burst())
        client = Client(serve.url, serve.api_key)
        try:
            client.track(*(r.json() for r in responses if r.status_code == 201))
            codes = sorted(r.status_code for r in responses)
            assert codes == [201, 201, 201, 503, 503, 503], [r.text for r in responses]
            refused = next(r for r in responses if r.status_code == 503)
            assert refused.json()["code"] == "capacity" and "Retry-After" in refused.headers
            assert len(client.call("GET", "/v1/sandboxes")["items"]) == 3

            client.delete(client.created[0])
            again = client.create()  # the freed place is usable at once
            assert client.sh(again["id"], "echo placed") == "placed\n"
        finally:
            client.close()
