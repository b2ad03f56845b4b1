"""The routes FastAPI builds at a router's first match are built while the app serves (``compose/warmup.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI

from cryobox.compose.warmup import warm_routes
from cryobox.registry import Registry
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, app_env, registry
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture


@pytest.fixture
async def env(registry: Registry) -> AsyncIterator[Env]:
    async with app_env(registry, FakeAgent(name="a"), Quota()) as env:
        yield env


def _unbuilt(routes: list[Any]) -> list[Any]:
    """Included routers whose routes FastAPI has not built yet (its private state, which warm_routes relies on)."""
    found = []
    for route in routes:
        if hasattr(route, "_effective_candidates_version"):
            if route._effective_candidates_version is None:
                found.append(route)
            else:
                found += _unbuilt(route._effective_candidates)
    return found


async def test_every_router_is_built_before_a_request_needs_it(env: Env) -> None:
    app: FastAPI = env.transport.app  # type: ignore[union-attr]
    await asyncio.sleep(0.5)  # the lifespan's own warm-up is not running under the ASGI transport: nothing built
    assert len(_unbuilt(app.router.routes)) > 20  # FastAPI still builds routers lazily (else this module goes)
    assert await warm_routes(app) > 20
    assert _unbuilt(app.router.routes) == []
    response = await env.client.get("/e2b/sandboxes")  # matched against every router: all built already
    assert response.status_code == 200


async def test_requests_are_served_while_routes_are_built(env: Env) -> None:
    app: FastAPI = env.transport.app  # type: ignore[union-attr]
    warming = asyncio.create_task(warm_routes(app))
    response = await env.client.get("/v1/sandboxes")  # interleaves with the warm-up, never waits for all of it
    assert response.status_code == 200
    assert await warming > 20
