"""E2B's volumes API (``/e2b/volumes``) through the served app with a fake agent, driven by the unmodified SDK's
``Volume`` (``tests/integration/apps/e2b_volumes_app.py``); and the token being the volume's own."""

from __future__ import annotations

import httpx

from cryobox.registry import Registry
from tests.support import e2b_templates
from tests.support.app import registry
from tests.support.e2b_templates import Served

__all__ = ["registry"]  # the fixture
served = e2b_templates.served


async def test_the_sdks_volume_calls(served: Served, registry: Registry) -> None:
    report = await served.app("e2b_volumes_app.py", "dataset")
    assert "fatal" not in report, report
    created = report["created"]
    assert created["name"] == "dataset" and created["id"].startswith("vol-") and created["has_token"], created
    assert report["listed"] == ["dataset"]
    assert report["info"] == {"id": created["id"], "name": "dataset"}
    assert report["connect_token"] is True
    assert report["taken"]["class"] == "VolumeException" and "already exists" in report["taken"]["message"]
    assert report["unknown"]["class"] == "VolumeNotFoundException", report["unknown"]
    assert report["destroyed"] is True and report["destroyed_again"] is False
    assert report["listed_after"] == []
    assert served.agent.volumes == {}  # the image went with it


async def test_a_volume_of_another_workspace_is_not_found_and_tokens_differ(served: Served, registry: Registry) -> None:
    headers = {"X-API-Key": served.key}
    async with httpx.AsyncClient(base_url=f"{served.url}/e2b", headers=headers) as client:
        first = (await client.post("/volumes", json={"name": "a"})).json()
        second = (await client.post("/volumes", json={"name": "b"})).json()
        assert first["token"] != second["token"] and len(first["token"]) >= 32
        other_ws = registry.ensure_workspace("beta").id
        _, other_key = registry.create_key(other_ws)
        foreign = await client.get(f"/volumes/{first['volumeID']}", headers={"X-API-Key": other_key})
        assert foreign.status_code == 404 and foreign.json()["code"] == 404
        bad = await client.post("/volumes", json={"name": "x", "size": 5})
        assert bad.status_code == 400, bad.text
