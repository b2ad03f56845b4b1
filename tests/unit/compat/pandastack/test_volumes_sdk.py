"""PandaStack's SDK (the installed ``pandastack`` 0.10.0, unchanged; sync, so it runs in a worker thread) against a
served control plane with a fake agent: ``client.volumes.create/list/get/delete`` as it calls ``/v1/volumes``; a
taken name and a delete while attached are its ``BadRequestError``, an unknown name its ``NotFoundError``."""

from __future__ import annotations

import asyncio

import pandastack
import pytest
from pandastack.exceptions import BadRequestError, NotFoundError

from tests.support.buildapp import BuildEnv, build_env, registry

__all__ = ["build_env", "registry"]  # fixtures


async def test_volumes_through_the_pandastack_sdk(build_env: BuildEnv) -> None:
    def scenario() -> dict[str, object]:
        client = pandastack.Client(api_url=build_env.url, api_key=build_env.key, timeout=30)
        made = client.volumes.create("dataset", size_mb=256)
        listed = client.volumes.list()
        got = client.volumes.get("dataset")
        with pytest.raises(BadRequestError):
            client.volumes.create("dataset", size_mb=64)
        with pytest.raises(NotFoundError):
            client.volumes.get("nope")
        client.volumes.delete("dataset")
        with pytest.raises(NotFoundError):
            client.volumes.get("dataset")
        return {"made": made, "listed": listed, "got": got}

    out = await asyncio.to_thread(scenario)
    made, got = out["made"], out["got"]
    assert isinstance(made, dict) and isinstance(got, dict)
    assert (made["name"], made["size_mb"], made["size_bytes"]) == ("dataset", 256, 256 << 20)
    assert got["id"] == made["id"] and out["listed"] == [got]
    assert build_env.agent.volumes == {}
