"""``AsyncVolumes`` against the app with a fake agent: the calls, their answers, and the errors a user can cause
(refused before sending where the SDK can tell)."""

from __future__ import annotations

import pytest

from cryobox.errors import InvalidArgument, NotFound, StateError, WorkspaceQuotaExceeded
from cryobox.registry import Registry
from cryobox.sdk import AsyncVolumes
from cryobox.server.control.quotas import Quota
from tests.support.app import app_env, registry
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture


async def test_the_sdk_makes_lists_grows_and_deletes_volumes(registry: Registry) -> None:
    async with app_env(registry, FakeAgent(name="a"), Quota(volumes=1)) as env:
        key = env.client.headers["Authorization"].split()[1]
        volumes = AsyncVolumes(api_url="http://ctl", api_key=key, http=env.client)
        made = await volumes.create("cache", size_mb=64)
        assert (made.name, made.size_mb, made.attached_to) == ("cache", 64, [])
        assert [v.id for v in await volumes.list()] == [made.id]
        assert (await volumes.resize("cache", size_mb=128)).size_bytes == 128 << 20
        assert (await volumes.get("cache")).size_mb == 128
        with pytest.raises(StateError):
            await volumes.create("cache", size_mb=64)
        with pytest.raises(WorkspaceQuotaExceeded):
            await volumes.create("other", size_mb=64)
        calls = len(env.agent.calls)
        with pytest.raises(InvalidArgument):
            await volumes.create("a/b")
        with pytest.raises(InvalidArgument):
            await volumes.create("ok", size_mb=8)
        assert len(env.agent.calls) == calls  # refused before anything was sent
        await volumes.delete("cache")
        with pytest.raises(NotFound):
            await volumes.get("cache")
