"""Prometheus metrics in a private registry, and the ASGI middleware that labels requests by route template."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from cryobox.agent.hostagent.metrics import AgentMetrics
from cryobox.agent.sandbox.admission import AdmissionConfig, AdmissionController
from cryobox.server.metrics import Metrics, MetricsMiddleware
from tests.support.metrics import requests_total, sample


def test_render_lists_metrics_with_labels() -> None:
    metrics = Metrics()
    metrics.observe_create("ok", "restore", 0.08)
    metrics.observe_create("refused", "restore")
    metrics.observe_exec("timeout", 2.0)
    metrics.http_requests.labels(route="/v1/health", method="GET", status="200").inc()
    metrics.http_seconds.labels(route="/v1/health", method="GET").observe(0.001)

    body, content_type = metrics.render()
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert 'cryobox_creates_total{boot_mode="restore",result="ok"} 1.0' in text
    assert 'cryobox_creates_total{boot_mode="restore",result="refused"} 1.0' in text
    assert 'cryobox_creates_total{boot_mode="cold",result="error"} 0.0' in text  # pre-initialised
    assert 'cryobox_create_duration_seconds_bucket{le="0.1"} 1.0' in text
    assert 'cryobox_create_duration_seconds_bucket{le="0.02"} 0.0' in text
    assert 'cryobox_create_duration_seconds_bucket{le="30.0"} 1.0' in text
    assert 'cryobox_exec_duration_seconds_count{result="timeout"} 1.0' in text
    assert 'cryobox_exec_duration_seconds_count{result="ok"} 0.0' in text
    assert 'cryobox_sandboxes{state="running"} 0.0' in text
    assert 'cryobox_http_requests_total{method="GET",route="/v1/health",status="200"} 1.0' in text
    assert 'cryobox_http_request_duration_seconds_count{method="GET",route="/v1/health"} 1.0' in text


def test_registries_are_private() -> None:
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" on a shared registry
    first.observe_create("ok", "cold", 1.0)
    assert sample(first, "cryobox_creates_total", result="ok", boot_mode="cold") == 1.0
    assert sample(second, "cryobox_creates_total", result="ok", boot_mode="cold") == 0.0
    assert REGISTRY.get_sample_value("cryobox_creates_total", {"result": "ok", "boot_mode": "cold"}) is None

    registry = CollectorRegistry()
    assert Metrics(registry).registry is registry


def test_sandbox_states_zero_missing_states() -> None:
    metrics = Metrics()
    metrics.set_sandbox_states({"running": 3, "paused": 1, "exotic": 2})
    assert sample(metrics, "cryobox_sandboxes", state="running") == 3
    assert sample(metrics, "cryobox_sandboxes", state="exotic") == 2
    metrics.set_sandbox_states({"paused": 2})
    assert sample(metrics, "cryobox_sandboxes", state="running") == 0
    assert sample(metrics, "cryobox_sandboxes", state="exotic") == 0
    assert sample(metrics, "cryobox_sandboxes", state="paused") == 2


def test_render_refreshes_sandbox_states_from_provider() -> None:
    metrics = Metrics()
    counts = {"running": 1}
    metrics.set_sandbox_state_provider(lambda: counts)
    assert b'cryobox_sandboxes{state="running"} 1.0' in metrics.render()[0]
    counts = {"running": 5, "hibernated": 2}
    text = metrics.render()[0]
    assert b'cryobox_sandboxes{state="running"} 5.0' in text
    assert b'cryobox_sandboxes{state="hibernated"} 2.0' in text


def test_failing_provider_keeps_last_counts(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    metrics.set_sandbox_states({"running": 4})

    def broken() -> dict[str, int]:
        raise RuntimeError("agent unreachable")

    metrics.set_sandbox_state_provider(broken)
    assert b'cryobox_sandboxes{state="running"} 4.0' in metrics.render()[0]
    assert "sandbox state provider failed" in caplog.text


async def test_admission_series_are_the_agents() -> None:
    """The admission series live in the agent's registry (exported from the start), not the control plane's."""
    text = await AgentMetrics().text()
    assert "cryobox_admission_queue_depth 0.0" in text
    assert 'cryobox_admission_wait_seconds_count{admitted="false"} 0.0' in text
    assert "cryobox_admission" not in Metrics().render()[0].decode()


async def test_admission_observer_feeds_metrics() -> None:
    metrics = AgentMetrics()
    config = AdmissionConfig(max_concurrent=1, queue_length=0, timeout_s=1)
    ctrl = AdmissionController(config, observer=metrics)
    async with ctrl.slot():
        with pytest.raises(Exception, match="queue full"):
            async with ctrl.slot():
                pass
    assert sample(metrics, "cryobox_admission_wait_seconds_count", admitted="true") == 1
    assert sample(metrics, "cryobox_admission_wait_seconds_count", admitted="false") == 1
    metrics.on_queue_depth(7)
    assert sample(metrics, "cryobox_admission_queue_depth") == 7


# -- HTTP middleware ------------------------------------------------------------------------------------------


def make_app(metrics: Metrics) -> FastAPI:
    app = FastAPI()
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/items/{item_id}")
    async def get_item(item_id: str) -> dict[str, str]:
        if item_id == "missing":
            raise HTTPException(status_code=404, detail="no such item")
        return {"id": item_id}

    @app.post("/items/{item_id}/exec")
    async def exec_item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("kaboom")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(5):
                yield f"chunk-{i};".encode()

        return StreamingResponse(chunks(), media_type="text/plain")

    return app


def client_for(app: FastAPI, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    """An in-process httpx client (starlette's TestClient warns about httpx -> httpx2 under this starlette)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def test_middleware_labels_by_route_template() -> None:
    metrics = Metrics()
    async with client_for(make_app(metrics)) as client:
        for item in ("a", "b", "c"):
            assert (await client.get(f"/items/{item}")).status_code == 200
        assert (await client.post("/items/a/exec")).status_code == 200
        assert (await client.get("/items/missing")).status_code == 404

    assert requests_total(metrics, "/items/{item_id}", "GET", "200") == 3
    assert requests_total(metrics, "/items/{item_id}", "GET", "404") == 1
    assert requests_total(metrics, "/items/{item_id}/exec", "POST", "200") == 1
    count = sample(metrics, "cryobox_http_request_duration_seconds_count", route="/items/{item_id}", method="GET")
    assert count == 4
    text = metrics.render()[0].decode()
    assert "/items/a" not in text  # never the raw path


async def test_unmatched_paths_share_one_label() -> None:
    metrics = Metrics()
    async with client_for(make_app(metrics)) as client:
        for path in ("/nope", "/also/not/here", "/items"):
            assert (await client.get(path)).status_code == 404
        assert (await client.request("BREW", "/nope")).status_code == 404

    assert requests_total(metrics, "unmatched", "GET", "404") == 3
    assert requests_total(metrics, "unmatched", "OTHER", "404") == 1
    assert "/nope" not in metrics.render()[0].decode()


async def test_wrong_method_keeps_route_label() -> None:
    metrics = Metrics()
    async with client_for(make_app(metrics)) as client:
        assert (await client.delete("/items/a")).status_code == 405
    assert requests_total(metrics, "/items/{item_id}", "DELETE", "405") == 1


async def test_unhandled_exception_counts_as_500() -> None:
    metrics = Metrics()
    async with client_for(make_app(metrics), raise_app_exceptions=False) as client:
        assert (await client.get("/boom")).status_code == 500
    assert requests_total(metrics, "/boom", "GET", "500") == 1


async def test_streaming_response_passes_through() -> None:
    metrics = Metrics()
    async with client_for(make_app(metrics)) as client:
        async with client.stream("GET", "/stream") as response:
            assert response.status_code == 200
            received = [chunk async for chunk in response.aiter_bytes()]
    assert b"".join(received) == b"".join(f"chunk-{i};".encode() for i in range(5))
    assert requests_total(metrics, "/stream", "GET", "200") == 1


async def test_non_http_scopes_pass_through() -> None:
    metrics = Metrics()
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    await MetricsMiddleware(app, metrics)({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan"]
    assert "cryobox_http_requests_total{" not in metrics.render()[0].decode()


async def test_streaming_chunks_are_forwarded_one_by_one() -> None:
    """Driving the ASGI app directly: each chunk leaves as its own message, in order, before the stream ends."""
    metrics = Metrics()
    app = make_app(metrics)
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/stream",
        "raw_path": b"/stream",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
        "state": {},
    }
    messages: list[Message] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]
    never_disconnects = asyncio.Event()

    async def receive() -> Message:
        if requests:
            return requests.pop()
        await never_disconnects.wait()  # the client stays connected (cancelled once the response is done)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        messages.append(message)

    await asyncio.wait_for(app(scope, receive, send), 5)
    assert messages[0]["type"] == "http.response.start"
    assert messages[0]["status"] == 200
    chunks = [m["body"] for m in messages[1:] if m["type"] == "http.response.body" and m.get("body")]
    assert chunks == [f"chunk-{i};".encode() for i in range(5)]
    assert messages[-1]["type"] == "http.response.body"
    assert messages[-1].get("more_body", False) is False
    assert requests_total(metrics, "/stream", "GET", "200") == 1
