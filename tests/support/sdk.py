"""The SDK over an httpx.MockTransport: canned API bodies (a sandbox, a snapshot, a fork tree, SSE streams),
recording handlers, error replies, and :class:`MockApi`, which builds the sync or the async SDK objects alike;
:class:`FakeTime`, the clock, sleep and jitter a RetryPolicy is given. Shared by the SDK's, the CLI's and
``cryobox capture``'s unit tests."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import httpx

from cryobox import AsyncForkTree, AsyncSandbox, AsyncSnapshots, ForkTree, Sandbox, Snapshots, models
from cryobox.sdk import ClientConfig, RetryPolicy
from tests.support.clock import FakeClock

Handler = Callable[[httpx.Request], httpx.Response]
T = TypeVar("T")


def error_response(
    status: int, code: str, message: str = "boom", details: dict[str, Any] | None = None
) -> httpx.Response:
    return httpx.Response(status, json={"error": message, "code": code, "details": details or {}})


INFO: dict[str, Any] = {
    "id": "sbx_0123",
    "template": "code-interpreter",
    "cpu": 1,
    "memory_mb": 512,
    "status": "running",
    "guest_ip": None,
    "metadata": {"owner": "tests"},
    "from_snapshot": None,
    "boot_ms": 41.5,
    "boot_mode": "restore",
    "created_at": "2024-05-01T12:00:00Z",
    "persistent": False,
    "expires_at": "2024-05-01T13:00:00Z",
    "host": "local",
    "instance_id": "5f0c6a1e2b3d4c5e8f9a0b1c2d3e4f50",
    "network": {
        "default": "deny",
        "allow": ["203.0.113.0/24", "pypi.org"],
        "deny": [],
        "ports": [443],
        "public_traffic": True,
        "mask_request_host": None,
    },
    "on_timeout": "kill",
    "auto_wake": True,
    "hibernated_at": None,
    "volumes": None,
}
LIFECYCLE = {
    "ttl_seconds": 600,
    "persistent": True,
    "idle_seconds": 12.5,
    "expires_at": "2024-05-01T13:10:00Z",
    "on_timeout": "kill",
    "auto_wake": True,
    "hibernated_at": None,
    "retained_until": None,
}
ENTRY = {"name": "a.txt", "is_dir": False, "size": 3, "mode": 0o100644, "mtime": 1.5}
SNAP: dict[str, Any] = {
    "id": "snp_0001",
    "sandbox_id": "sbx_0123",
    "template": "code-interpreter",
    "size_bytes": 123456,
    "unique_bytes": 23456,
    "shared_bytes": 100000,
    "created_at": "2024-05-01T12:30:00Z",
    "labels": {"step": "3"},
    "retain": True,
    "parent_id": "snp_0000",
    "pause_ms": 18.5,
    "location": "stored",
    "host": "host-a",
}
CHILD_1 = {**INFO, "id": "sbx_c1", "from_snapshot": "snp_tree"}
CHILD_2 = {**INFO, "id": "sbx_c2", "from_snapshot": "snp_tree"}
TREE = {
    "tree_id": "tree_1",
    "parent_id": "sbx_0123",
    "snapshot_id": "snp_tree",
    "children": [CHILD_1, CHILD_2],
    "errors": [{"index": 2, "error": "no capacity"}],
}
SSE = (
    'event: stdout\ndata: {"chunk": "hello "}\n\n'
    'event: stderr\ndata: {"chunk": "warn\\n"}\n\n'
    ": keep-alive comment\n\n"
    'event: stdout\ndata: {"chunk": "world\\n"}\n\n'
    'event: exit\ndata: {"exit_code": 7}\n\n'
    'event: stdout\ndata: {"chunk": "after exit"}\n\n'
)
SSE_NO_EXIT = 'event: stdout\ndata: {"chunk": "partial"}\n\n'
SSE_TIMEOUT = 'event: stdout\ndata: {"chunk": "a"}\n\nevent: error\ndata: {"error": "timed out", "code": "timeout"}\n\n'


class Recorder:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.handler(request)


def exec_ok(exit_code: int) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"stdout": "out\n", "stderr": "err\n", "exit_code": exit_code, "duration_ms": 12.5}
        )

    return handler


def capacity(retry_after: str | None = "2", message: str = "no capacity") -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(503, json={"error": message, "code": "capacity", "details": {}}, headers=headers)


def created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json=INFO)


class FakeTime(FakeClock):
    """Injected into RetryPolicy: the fake clock (from 0, moving only when slept on) and a 'random' that picks
    mid-range."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.jitter_caps: list[float] = []

    def clock(self) -> float:
        return self()

    def rand(self, low: float, high: float) -> float:
        assert low == 0.0
        self.jitter_caps.append(high)
        return high / 2

    def policy(self, budget_s: float = 60.0) -> RetryPolicy:
        return RetryPolicy(
            budget_s=budget_s, sleep=self.sleep, async_sleep=self.async_sleep, rand=self.rand, clock=self.clock
        )


def sequence(*responses: httpx.Response | Handler) -> Handler:
    """A handler answering with ``responses`` in order (a callable is called with the request)."""
    pending = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        item = pending.pop(0)
        return item if isinstance(item, httpx.Response) else item(request)

    return handler


def sse(body: str) -> Handler:
    return lambda request: httpx.Response(200, content=body.encode(), headers={"Content-Type": "text/event-stream"})


@overload
async def resolve(value: Sandbox | Awaitable[AsyncSandbox]) -> Sandbox | AsyncSandbox: ...


@overload
async def resolve(value: ForkTree | Awaitable[AsyncForkTree]) -> ForkTree | AsyncForkTree: ...


@overload
async def resolve(value: T | Awaitable[T]) -> T: ...


async def resolve(value: object) -> object:
    """The value of a sync call, or the awaited value of an async one."""
    if inspect.isawaitable(value):
        return await value
    return value


class MockApi:
    """Builds the sync or the async SDK objects over a MockTransport, and closes their clients afterwards."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.sync_clients: list[httpx.Client] = []
        self.async_clients: list[httpx.AsyncClient] = []
        self.config = ClientConfig(api_url="http://test", api_key="k")

    @property
    def sandbox_cls(self) -> type[Sandbox] | type[AsyncSandbox]:
        return Sandbox if self.kind == "sync" else AsyncSandbox

    def _sync_http(self, recorder: Recorder) -> httpx.Client:
        http = httpx.Client(transport=httpx.MockTransport(recorder), base_url="http://test")
        self.sync_clients.append(http)
        return http

    def _async_http(self, recorder: Recorder) -> httpx.AsyncClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(recorder), base_url="http://test")
        self.async_clients.append(http)
        return http

    def sandbox(
        self, handler: Handler, retry: RetryPolicy | None = None, **info: Any
    ) -> tuple[Sandbox | AsyncSandbox, Recorder]:
        recorder = Recorder(handler)
        model = models.Sandbox.model_validate({**INFO, **info})
        policy = retry or RetryPolicy()
        if self.kind == "sync":
            return Sandbox(model, self.config, self._sync_http(recorder), retry=policy), recorder
        return AsyncSandbox(model, self.config, self._async_http(recorder), retry=policy), recorder

    def snapshots(self, handler: Handler) -> tuple[Snapshots | AsyncSnapshots, Recorder]:
        recorder = Recorder(handler)
        if self.kind == "sync":
            return Snapshots(http=self._sync_http(recorder)), recorder
        return AsyncSnapshots(http=self._async_http(recorder)), recorder

    async def create(self, handler: Handler, **kwargs: Any) -> tuple[Sandbox | AsyncSandbox, Recorder]:
        recorder = Recorder(handler)
        if self.kind == "sync":
            return Sandbox.create(http=self._sync_http(recorder), **kwargs), recorder
        return await AsyncSandbox.create(http=self._async_http(recorder), **kwargs), recorder

    async def close(self) -> None:
        for client in self.sync_clients:
            client.close()
        for aclient in self.async_clients:
            await aclient.aclose()


def route(request: httpx.Request) -> tuple[str, str]:
    return request.method, request.url.path
