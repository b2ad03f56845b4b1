"""Prometheus metrics for the control plane, kept in a registry of their own (never the global one; the agents'
series are theirs: :mod:`cryobox.agent.hostagent.metrics`).

:class:`Metrics` owns the collectors; :class:`MetricsMiddleware` is a pure ASGI middleware that counts and
times HTTP requests labelled by route template, so label cardinality stays bounded and streaming responses
pass through unbuffered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, get_args

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..models import BootMode, SandboxStatus

log = logging.getLogger(__name__)

CREATE_RESULTS: Final = ("ok", "error", "refused")
EXEC_RESULTS: Final = ("ok", "timeout", "error")
UNMATCHED_ROUTE: Final = "unmatched"
HTTP_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

CREATE_BUCKETS: Final = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 30.0)
EXEC_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
HTTP_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

SandboxStateProvider = Callable[[], Mapping[str, int]]
ExternalSource = Callable[[], Awaitable[str]]


class Metrics:
    """All cryobox collectors, registered in ``registry`` (a fresh :class:`CollectorRegistry` by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        self._external: list[ExternalSource] = []
        r = self.registry
        self.creates = Counter(
            "cryobox_creates", "Sandbox create requests by outcome", ["result", "boot_mode"], registry=r
        )
        self.create_seconds = Histogram(
            "cryobox_create_duration_seconds", "Time to create a sandbox", buckets=CREATE_BUCKETS, registry=r
        )
        self.sandboxes = Gauge("cryobox_sandboxes", "Sandboxes by state", ["state"], registry=r)
        self.exec_seconds = Histogram(
            "cryobox_exec_duration_seconds", "Command execution time", ["result"], buckets=EXEC_BUCKETS, registry=r
        )
        self.http_requests = Counter(
            "cryobox_http_requests", "HTTP requests by route template", ["route", "method", "status"], registry=r
        )
        self.http_seconds = Histogram(
            "cryobox_http_request_duration_seconds",
            "HTTP request duration by route template",
            ["route", "method"],
            buckets=HTTP_BUCKETS,
            registry=r,
        )
        self._sandbox_states: set[str] = set(get_args(SandboxStatus))
        self._sandbox_state_provider: SandboxStateProvider | None = None

        # Export every known label combination from the start, so rates and ratios work before the first event.
        for result in CREATE_RESULTS:
            for boot_mode in get_args(BootMode):
                self.creates.labels(result=result, boot_mode=boot_mode)
        for result in EXEC_RESULTS:
            self.exec_seconds.labels(result=result)
        self.set_sandbox_states({})

    # -- recording helpers ----------------------------------------------------------------------------------

    def observe_create(self, result: str, boot_mode: str, seconds: float | None = None) -> None:
        """Count one create (``result`` in ok|error|refused) and, when given, its duration."""
        self.creates.labels(result=result, boot_mode=boot_mode).inc()
        if seconds is not None:
            self.create_seconds.observe(seconds)

    def observe_exec(self, result: str, seconds: float) -> None:
        """Record one exec (``result`` in ok|timeout|error)."""
        self.exec_seconds.labels(result=result).observe(seconds)

    def set_sandbox_states(self, counts: Mapping[str, int]) -> None:
        """Set ``cryobox_sandboxes{state}`` to ``counts``; every state seen before but absent now becomes 0."""
        self._sandbox_states.update(counts)
        for state in self._sandbox_states:
            self.sandboxes.labels(state=state).set(counts.get(state, 0))

    def set_sandbox_state_provider(self, provider: SandboxStateProvider | None) -> None:
        """Have :meth:`render` refresh the sandbox gauge from ``provider()`` before each scrape."""
        self._sandbox_state_provider = provider

    # -- exposition -----------------------------------------------------------------------------------------

    def add_source(self, source: ExternalSource) -> None:
        """Append another process's text exposition (the memory server's) to every scrape."""
        self._external.append(source)

    async def render_all(self) -> tuple[bytes, str]:
        """:meth:`render` plus every external source; a source that fails is skipped (and logged)."""
        body, content_type = self.render()
        for source in self._external:
            try:
                body += (await source()).encode()
            except Exception as err:
                log.warning("metrics source failed: %s", err)
        return body, content_type

    def render(self) -> tuple[bytes, str]:
        """The text exposition of this registry and its content type."""
        provider = self._sandbox_state_provider
        if provider is not None:
            try:
                self.set_sandbox_states(provider())
            except Exception:
                log.exception("sandbox state provider failed; exporting the last known counts")
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def route_template(scope: Scope) -> str:
    """The matched route's path template (``/v1/sandboxes/{sandbox_id}``), or ``"unmatched"``; never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str) and path:
        return path
    return UNMATCHED_ROUTE


class MetricsMiddleware:
    """Pure ASGI middleware recording ``http_requests`` and ``http_seconds`` for every HTTP request.

    Add with ``app.add_middleware(MetricsMiddleware, metrics=metrics)``. The route label is read from
    ``scope["route"]``, which the router sets on the shared scope while routing. Routes inside a mounted
    sub-application are labelled with their path relative to the mount.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        status = 500  # if the app fails before starting a response, the server answers 500
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - started
            method = str(scope.get("method", "")).upper()
            if method not in HTTP_METHODS:
                method = "OTHER"
            route = route_template(scope)
            self.metrics.http_requests.labels(route=route, method=method, status=str(status)).inc()
            self.metrics.http_seconds.labels(route=route, method=method).observe(elapsed)
