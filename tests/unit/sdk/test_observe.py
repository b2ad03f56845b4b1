"""SDK: a sandbox's samples (``metrics``) and log (``logs``) over an httpx.MockTransport, for the sync and the async
classes alike: the query sent, the answer parsed, bad values refused before anything is sent, errors mapped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from cryobox import models
from cryobox.errors import InvalidArgument, NotFound
from tests.support.sdk import MockApi, error_response, resolve, route

SERIES: dict[str, Any] = {
    "sandbox_id": "sbx_0123",
    "interval_seconds": 5.0,
    "samples": [
        {
            "timestamp": 1714564800.0,
            "cpu_count": 1,
            "cpu_pct": 12.5,
            "memory_bytes": 300 << 20,
            "mem_total": 512 << 20,
            "mem_used": 120 << 20,
            "mem_cache": 30 << 20,
            "disk_total": 1 << 30,
            "disk_used": 1 << 28,
            "guest_view": True,
        }
    ],
    "dropped": 0,
}
LOGS: dict[str, Any] = {
    "sandbox_id": "sbx_0123",
    "logs": [
        {"offset": 7, "timestamp": 1714564801.5, "level": "warn", "source": "console", "message": "disk full?"},
    ],
    "next_offset": 8,
    "dropped": 7,
}


@pytest.fixture(params=["sync", "async"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[MockApi]:
    harness = MockApi(request.param)
    yield harness
    await harness.close()


async def test_metrics_sends_the_range_and_parses_the_samples(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json=SERIES))
    series = await resolve(sbx.metrics(start=datetime(2024, 5, 1, 12, 0, tzinfo=UTC), end=1714564900.5))
    (request,) = rec.requests
    assert route(request) == ("GET", "/v1/sandboxes/sbx_0123/metrics")
    assert dict(request.url.params) == {"start": "1714564800.0", "end": "1714564900.5"}
    assert isinstance(series, models.SandboxMetrics) and series.samples[0].cpu_pct == 12.5
    await resolve(sbx.metrics())
    assert dict(rec.requests[-1].url.params) == {}


async def test_logs_sends_the_query_and_parses_the_page(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json=LOGS))
    page = await resolve(sbx.logs(offset=7, limit=5, level="warn", search="disk"))
    (request,) = rec.requests
    assert route(request) == ("GET", "/v1/sandboxes/sbx_0123/logs")
    assert dict(request.url.params) == {
        "offset": "7",
        "limit": "5",
        "direction": "forward",
        "level": "warn",
        "search": "disk",
    }
    assert page.next_offset == 8 and page.logs[0].source == "console" and page.dropped == 7
    await resolve(sbx.logs(direction="backward"))
    assert dict(rec.requests[-1].url.params) == {"limit": "100", "direction": "backward"}


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        ("metrics", {"start": 10.0, "end": 5.0}),
        ("metrics", {"start": -1.0}),
        ("logs", {"limit": 1001}),
        ("logs", {"offset": -2}),
        ("logs", {"direction": "sideways"}),
        ("logs", {"level": "loud"}),
        ("logs", {"search": "x" * 300}),
    ],
)
async def test_bad_values_are_refused_before_sending(api: MockApi, call: str, kwargs: dict[str, Any]) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json=LOGS))
    with pytest.raises(InvalidArgument):
        await resolve(getattr(sbx, call)(**kwargs))
    assert rec.requests == []


async def test_errors_are_mapped(api: MockApi) -> None:
    sbx, _ = api.sandbox(lambda r: error_response(404, "not_found", "no sandbox"))
    with pytest.raises(NotFound):
        await resolve(sbx.metrics())
    with pytest.raises(NotFound):
        await resolve(sbx.logs())
