"""SDK: AsyncSandbox over an httpx.MockTransport (the sync twin is tested in test_sync.py; the helpers both use are
in tests/support/sdk.py)."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from cryobox import AsyncFilesystem, AsyncSandbox, Filesystem, Sandbox, models
from cryobox.errors import (
    CommandFailed,
    CryoboxError,
    GuestError,
    HostUnavailable,
    NotFound,
    QuotaExceeded,
    SandboxTimeout,
    StateError,
)
from cryobox.sdk import ClientConfig, ExecResult, Lifecycle, RetryPolicy, StreamEvent
from tests.support.sdk import (
    ENTRY,
    INFO,
    LIFECYCLE,
    SSE,
    SSE_NO_EXIT,
    SSE_TIMEOUT,
    FakeTime,
    Handler,
    Recorder,
    capacity,
    created,
    error_response,
    exec_ok,
    sequence,
    sse,
)

MakeHttp = Callable[[Handler], tuple[httpx.AsyncClient, Recorder]]
MakeSandbox = Callable[..., tuple[AsyncSandbox, Recorder]]


@pytest.fixture
async def make_http() -> AsyncIterator[MakeHttp]:
    clients: list[httpx.AsyncClient] = []

    def make(handler: Handler) -> tuple[httpx.AsyncClient, Recorder]:
        recorder = Recorder(handler)
        http = httpx.AsyncClient(transport=httpx.MockTransport(recorder), base_url="http://test")
        clients.append(http)
        return http, recorder

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def make_sandbox(make_http: MakeHttp) -> MakeSandbox:
    def make(handler: Handler, retry: RetryPolicy | None = None) -> tuple[AsyncSandbox, Recorder]:
        http, recorder = make_http(handler)
        info = models.Sandbox.model_validate(INFO)
        config = ClientConfig(api_url="http://test", api_key="k")
        return AsyncSandbox(info, config, http, retry=retry or RetryPolicy()), recorder

    return make


# --- parity with the sync class --------------------------------------------------------------------------------


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_") or name in ("__enter__", "__aenter__")}


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(Sandbox, AsyncSandbox), (Filesystem, AsyncFilesystem)])
def test_same_methods_as_sync(sync_cls: type, async_cls: type) -> None:
    renamed = {"aclose": "close", "__aenter__": "__enter__"}
    assert {renamed.get(name, name) for name in _public(async_cls)} == _public(sync_cls)
    for name in _public(async_cls):
        attr = inspect.getattr_static(async_cls, name)
        function = attr.__func__ if isinstance(attr, classmethod | staticmethod) else attr
        if isinstance(function, property):
            continue
        assert inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function), name


# --- construction ----------------------------------------------------------------------------------------------


async def test_create_posts_body_and_returns_sandbox(make_http: MakeHttp) -> None:
    http, rec = make_http(created)
    sbx = await AsyncSandbox.create("base", ttl_seconds=60, metadata={"owner": "tests"}, http=http)
    assert isinstance(sbx, AsyncSandbox)
    assert isinstance(sbx.info, models.Sandbox)
    assert sbx._http is http
    assert "AsyncSandbox('sbx_0123'" in repr(sbx)
    (request,) = rec.requests
    assert (request.method, request.url.path) == ("POST", "/v1/sandboxes")
    assert json.loads(request.content) == {
        "template": "base",
        "ttl_seconds": 60,
        "persistent": False,
        "metadata": {"owner": "tests"},
        "env": {},
    }


async def test_connect_not_found(make_http: MakeHttp) -> None:
    http, rec = make_http(lambda request: error_response(404, "not_found", "no such sandbox"))
    with pytest.raises(NotFound):
        await AsyncSandbox.connect("sbx_gone", http=http)
    assert rec.requests[0].url.path == "/v1/sandboxes/sbx_gone"


async def test_list_builds_filters(make_http: MakeHttp) -> None:
    http, rec = make_http(lambda request: httpx.Response(200, json={"items": [INFO]}))
    items = await AsyncSandbox.list(status="paused", metadata={"owner": "tests"}, http=http)
    assert [item.id for item in items] == ["sbx_0123"]
    assert dict(rec.requests[0].url.params) == {"status": "paused", "metadata.owner": "tests"}


async def test_connect_failure_is_host_unavailable(make_http: MakeHttp) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    http, _ = make_http(refuse)
    with pytest.raises(HostUnavailable, match="cannot reach the cryobox API") as info:
        await AsyncSandbox.create(http=http)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


# --- capacity retry --------------------------------------------------------------------------------------------


async def test_create_retries_capacity_with_async_sleep(make_http: MakeHttp) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(capacity("2"), capacity("3"), created))
    sbx = await AsyncSandbox.create(http=http, retry=fake.policy())
    assert sbx.id == "sbx_0123"
    assert fake.sleeps == [2.5, 4.0]
    assert fake.jitter_caps == [1, 2]
    assert len(rec.requests) == 3


async def test_retry_budget_exhausted_raises_last_refusal(make_http: MakeHttp) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(capacity("10"), capacity("10"), capacity("7", "third refusal"), created))
    with pytest.raises(HostUnavailable, match="third refusal") as info:
        await AsyncSandbox.create(http=http, retry=fake.policy(budget_s=25))
    assert fake.sleeps == [10.5, 11]
    assert len(rec.requests) == 3
    assert info.value.retry_after_s == 7


async def test_rate_limit_is_retried(make_http: MakeHttp) -> None:
    fake = FakeTime()
    limited = httpx.Response(429, json={"error": "slow down", "code": "rate_limited"}, headers={"Retry-After": "1"})
    http, _ = make_http(sequence(limited, limited, created))
    await AsyncSandbox.create(http=http, retry=fake.policy())
    assert fake.sleeps == [1.5, 2.0]


@pytest.mark.parametrize(
    "refusal",
    [
        capacity(retry_after=None),
        httpx.Response(503, text="Service Unavailable", headers={"Retry-After": "1"}),
        httpx.Response(429, json={"error": "slow down", "code": "rate_limited"}),
    ],
)
async def test_create_does_not_retry_other_refusals(make_http: MakeHttp, refusal: httpx.Response) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(refusal, created))
    with pytest.raises((HostUnavailable, QuotaExceeded)):
        await AsyncSandbox.create(http=http, retry=fake.policy())
    assert fake.sleeps == []
    assert len(rec.requests) == 1


async def test_non_create_requests_are_not_retried(make_sandbox: MakeSandbox) -> None:
    fake = FakeTime()
    sbx, rec = make_sandbox(lambda request: capacity("1"), fake.policy())
    with pytest.raises(HostUnavailable):
        await sbx.exec("true")
    with pytest.raises(HostUnavailable):
        await sbx.lifecycle()
    assert fake.sleeps == []
    assert len(rec.requests) == 2


# --- lifecycle -------------------------------------------------------------------------------------------------


async def test_refresh_lifecycle_and_patch(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/lifecycle"):
            return httpx.Response(200, json=LIFECYCLE)
        return httpx.Response(200, json={**INFO, "status": "hibernated"})

    sbx, rec = make_sandbox(handler)
    assert (await sbx.refresh()).status == "hibernated"
    assert await sbx.lifecycle() == Lifecycle(600, True, 12.5, "2024-05-01T13:10:00Z")
    await sbx.set_ttl(600)
    await sbx.set_persistent(False)
    assert [(r.method, r.url.path) for r in rec.requests] == [
        ("GET", "/v1/sandboxes/sbx_0123"),
        ("GET", "/v1/sandboxes/sbx_0123/lifecycle"),
        ("PATCH", "/v1/sandboxes/sbx_0123/lifecycle"),
        ("PATCH", "/v1/sandboxes/sbx_0123/lifecycle"),
    ]
    assert [json.loads(r.content) for r in rec.requests[2:]] == [{"ttl_seconds": 600}, {"persistent": False}]


# --- exec ------------------------------------------------------------------------------------------------------


async def test_exec(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(exec_ok(0))
    result = await sbx.exec("echo hi", env={"A": "1"}, cwd="/work")
    assert result == ExecResult(stdout="out\n", stderr="err\n", exit_code=0, duration_ms=12.5)
    assert rec.requests[0].url.path == "/v1/sandboxes/sbx_0123/exec"
    assert json.loads(rec.requests[0].content)["env"] == {"A": "1"}


async def test_exec_check_raises_command_failed(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(exec_ok(2))
    assert (await sbx.exec("exit 2")).exit_code == 2
    with pytest.raises(CommandFailed) as info:
        await sbx.exec("exit 2", check=True)
    assert (info.value.exit_code, info.value.stdout, info.value.stderr) == (2, "out\n", "err\n")


async def test_exec_timeout(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(504, "timeout", "command timed out after 1s"))
    with pytest.raises(SandboxTimeout, match="timed out"):
        await sbx.exec("sleep 10", timeout_seconds=1)


async def test_exec_stream(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(sse(SSE))
    out: list[str] = []
    events = [event async for event in sbx.exec_stream("x", on_stdout=out.append)]
    assert events == [
        StreamEvent(kind="stdout", chunk="hello "),
        StreamEvent(kind="stderr", chunk="warn\n"),
        StreamEvent(kind="stdout", chunk="world\n"),
        StreamEvent(kind="exit", exit_code=7),
    ]
    assert out == ["hello ", "world\n"]
    assert rec.requests[0].url.path == "/v1/sandboxes/sbx_0123/exec/stream"


async def test_exec_stream_without_exit_raises(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse(SSE_NO_EXIT))
    seen: list[StreamEvent] = []
    with pytest.raises(GuestError, match="ended before the command reported an exit code"):
        async for event in sbx.exec_stream("x"):
            seen.append(event)
    assert seen == [StreamEvent(kind="stdout", chunk="partial")]


async def test_exec_stream_error_event_maps_code(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse(SSE_TIMEOUT))
    with pytest.raises(SandboxTimeout, match="timed out"):
        async for _ in sbx.exec_stream("x"):
            pass


async def test_exec_stream_http_error(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(409, "wrong_state", "sandbox is paused"))
    with pytest.raises(StateError, match="paused"):
        async for _ in sbx.exec_stream("x"):
            pass


async def test_exec_stream_can_stop_early(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(sse(SSE))
    seen: list[StreamEvent] = []
    async with contextlib.aclosing(sbx.exec_stream("x")) as stream:
        async for event in stream:
            assert event == StreamEvent(kind="stdout", chunk="hello ")
            seen.append(event)
            break
    assert seen == [StreamEvent(kind="stdout", chunk="hello ")]  # the first event came, and the loop stopped there
    with pytest.raises(StopAsyncIteration):
        await anext(stream)  # closed: nothing more is read from it
    assert len(rec.requests) == 1


# --- filesystem ------------------------------------------------------------------------------------------------


async def test_filesystem(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.params["path"]
        if request.url.path.endswith("/fs/dir"):
            return httpx.Response(200, json={"path": path, "entries": [ENTRY]})
        if request.url.path.endswith("/fs/stat"):
            return (
                httpx.Response(200, json=ENTRY)
                if path != "/missing"
                else error_response(404, "not_found", "no such file")
            )
        if request.method == "PUT":
            return httpx.Response(200, json={"path": path, "bytes": len(request.content)})
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, content=b"\xffraw")

    sbx, rec = make_sandbox(handler)
    fs = sbx.filesystem
    assert isinstance(fs, AsyncFilesystem)
    assert await fs.write("/work/a.txt", "héllo") == len("héllo".encode())
    assert rec.requests[-1].content == "héllo".encode()
    assert await fs.read("/work/a.txt") == b"\xffraw"
    assert await fs.read_text("/work/a.txt", encoding="latin-1") == "ÿraw"
    assert [entry.name for entry in await fs.list("/work")] == ["a.txt"]
    assert (await fs.stat("/work/a.txt")).size == 3
    assert await fs.exists("/work/a.txt") is True
    assert await fs.exists("/missing") is False
    await fs.remove("/work/a.txt")
    assert rec.requests[-1].method == "DELETE"


# --- teardown --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [204, 404])
async def test_kill_succeeds_and_closes(make_sandbox: MakeSandbox, status: int) -> None:
    sbx, rec = make_sandbox(lambda request: error_response(404, "not_found") if status == 404 else httpx.Response(204))
    await sbx.kill()
    assert [(r.method, r.url.path) for r in rec.requests] == [("DELETE", "/v1/sandboxes/sbx_0123")]
    assert sbx._http.is_closed


async def test_kill_other_errors_raise_and_still_close(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(500, "internal", "delete failed"))
    with pytest.raises(CryoboxError, match="delete failed"):
        await sbx.kill()
    assert sbx._http.is_closed


async def test_aclose_keeps_sandbox(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(204))
    await sbx.aclose()
    assert rec.requests == []
    assert sbx._http.is_closed


async def test_async_with_kills(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(204))
    async with sbx as inner:
        assert inner is sbx
    assert [r.method for r in rec.requests] == ["DELETE"]


async def test_async_with_keeps_the_original_exception(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(500, "internal", "delete failed"))
    with pytest.raises(ValueError, match="body failed") as info:
        async with sbx:
            raise ValueError("body failed")
    assert any("delete failed" in note for note in info.value.__notes__)
