"""SDK: error mapping at the HTTP boundary, and the sync Sandbox over an httpx.MockTransport.

The async twin is tested in test_async.py (the helpers both use are in tests/support/sdk.py); the generation of
the sync code from the async code in test_unasync.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import cryobox
from cryobox import models
from cryobox.errors import (
    ERRORS_BY_CODE,
    CommandFailed,
    CryoboxError,
    GuestError,
    HostUnavailable,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxTimeout,
    StateError,
    Unauthorized,
)
from cryobox.sdk import AsyncSandbox, Lifecycle, RetryPolicy
from cryobox.sdk._base import DEFAULT_URL, error_from_response, parse_retry_after
from cryobox.sdk._sse import ExecStreamDecoder, SSEDecoder, SSEMessage
from cryobox.sdk._transport import ClientConfig, raise_for_error
from cryobox.sdk.sandbox import ExecResult, Sandbox, StreamEvent
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

# --- raise_for_error -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "invalid_argument", InvalidArgument),
        (401, "unauthorized", Unauthorized),
        (404, "not_found", NotFound),
        (409, "wrong_state", StateError),
        (413, "payload_too_large", PayloadTooLarge),
        (429, "rate_limited", QuotaExceeded),
        (503, "capacity", HostUnavailable),
        (504, "timeout", SandboxTimeout),
    ],
)
def test_error_codes_map_to_classes(status: int, code: str, cls: type[CryoboxError]) -> None:
    with pytest.raises(CryoboxError) as info:
        raise_for_error(error_response(status, code, f"it went wrong ({code})", {"sandbox_id": "sbx_1"}))
    assert type(info.value) is cls
    assert info.value.message == f"it went wrong ({code})"
    assert info.value.code == code
    assert info.value.details["sandbox_id"] == "sbx_1"


@pytest.mark.parametrize("cls", [ERRORS_BY_CODE[code] for code in sorted(ERRORS_BY_CODE)])
def test_wire_round_trip(cls: type[CryoboxError]) -> None:
    exc = cls("round trip")
    response = httpx.Response(exc.http_status, json=exc.to_wire())
    with pytest.raises(CryoboxError) as info:
        raise_for_error(response)
    assert type(info.value) is cls
    assert info.value.message == "round trip"


def test_capacity_retry_after_header() -> None:
    response = httpx.Response(
        503, json={"error": "no capacity", "code": "capacity", "details": {}}, headers={"Retry-After": "3"}
    )
    with pytest.raises(HostUnavailable) as info:
        raise_for_error(response)
    assert info.value.retry_after_s == 3


def test_capacity_without_retry_after_defaults_to_one_second() -> None:
    with pytest.raises(HostUnavailable) as info:
        raise_for_error(error_response(503, "capacity"))
    assert info.value.retry_after_s == 1


@pytest.mark.parametrize("status", [200, 201, 204, 301, 399])
def test_success_does_not_raise(status: int) -> None:
    raise_for_error(httpx.Response(status, json={"error": "ignored", "code": "not_found"}))


def test_non_json_404_maps_by_status() -> None:
    with pytest.raises(NotFound) as info:
        raise_for_error(httpx.Response(404, text="<html>Not Found</html>"))
    assert info.value.message == "HTTP 404"


def test_unknown_code_and_status_is_plain_cryobox_error() -> None:
    with pytest.raises(CryoboxError) as info:
        raise_for_error(error_response(405, "method_not_allowed", "Method Not Allowed"))
    assert type(info.value) is CryoboxError
    assert info.value.message == "Method Not Allowed"


def test_json_array_body_is_tolerated() -> None:
    with pytest.raises(CryoboxError) as info:
        raise_for_error(httpx.Response(400, json=["not", "an", "object"]))
    assert type(info.value) is InvalidArgument
    assert info.value.message == "HTTP 400"


def test_non_json_500_is_plain_cryobox_error() -> None:
    with pytest.raises(CryoboxError) as info:
        raise_for_error(httpx.Response(500, text="<html>Internal Server Error</html>"))
    assert type(info.value) is CryoboxError
    assert info.value.message == "HTTP 500"


def test_state_error_keeps_state_from_wire() -> None:
    with pytest.raises(StateError) as info:
        raise_for_error(
            error_response(409, "wrong_state", "sandbox is paused", {"state": "paused", "required": "running"})
        )
    assert info.value.details == {"state": "paused", "required": "running"}
    assert info.value.state == "paused"
    assert info.value.required == "running"


# --- Sandbox over MockTransport --------------------------------------------------------------------------------


@pytest.fixture
def make_sandbox() -> Iterator[Callable[[Handler], tuple[Sandbox, Recorder]]]:
    clients: list[httpx.Client] = []

    def make(handler: Handler) -> tuple[Sandbox, Recorder]:
        recorder = Recorder(handler)
        http = httpx.Client(transport=httpx.MockTransport(recorder), base_url="http://test")
        clients.append(http)
        info = models.Sandbox.model_validate(INFO)
        return Sandbox(info, ClientConfig(api_url="http://test", api_key="k"), http), recorder

    yield make
    for client in clients:
        client.close()


MakeSandbox = Callable[[Handler], tuple[Sandbox, Recorder]]


def test_sandbox_info(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(exec_ok(0))
    assert sbx.id == "sbx_0123"
    assert sbx.info.boot_mode == "restore"
    assert "sbx_0123" in repr(sbx)


def test_exec_posts_body_and_returns_result(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(exec_ok(0))
    result = sbx.exec("echo hi", timeout_seconds=5, env={"A": "1"}, cwd="/work", stdin="input")
    assert result == ExecResult(stdout="out\n", stderr="err\n", exit_code=0, duration_ms=12.5)
    (request,) = rec.requests
    assert request.method == "POST"
    assert request.url.path == "/v1/sandboxes/sbx_0123/exec"
    assert json.loads(request.content) == {
        "cmd": "echo hi",
        "timeout_seconds": 5,
        "env": {"A": "1"},
        "cwd": "/work",
        "stdin": "input",
    }


def test_exec_defaults(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(exec_ok(0))
    sbx.exec("true")
    assert json.loads(rec.requests[0].content) == {
        "cmd": "true",
        "timeout_seconds": 60.0,
        "env": {},
        "cwd": None,
        "stdin": None,
    }


def test_exec_nonzero_without_check_returns(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(exec_ok(3))
    assert sbx.exec("exit 3").exit_code == 3


def test_exec_check_raises_command_failed(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(exec_ok(3))
    with pytest.raises(CommandFailed) as info:
        sbx.exec("exit 3", check=True)
    assert info.value.exit_code == 3
    assert info.value.stdout == "out\n"
    assert info.value.stderr == "err\n"
    assert info.value.details == {"exit_code": 3}


def test_exec_check_passes_on_zero(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(exec_ok(0))
    assert sbx.exec("true", check=True).exit_code == 0


def test_exec_timeout_error(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(504, "timeout", "command timed out after 1s"))
    with pytest.raises(SandboxTimeout, match="timed out"):
        sbx.exec("sleep 10", timeout_seconds=1)


def test_exec_stream(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=SSE.encode(), headers={"Content-Type": "text/event-stream"})

    sbx, rec = make_sandbox(handler)
    events = list(sbx.exec_stream("echo hello world", env={"X": "y"}))
    assert events == [
        StreamEvent(kind="stdout", chunk="hello "),
        StreamEvent(kind="stderr", chunk="warn\n"),
        StreamEvent(kind="stdout", chunk="world\n"),
        StreamEvent(kind="exit", exit_code=7),
    ]
    (request,) = rec.requests
    assert request.method == "POST"
    assert request.url.path == "/v1/sandboxes/sbx_0123/exec/stream"
    assert json.loads(request.content)["cmd"] == "echo hello world"
    assert json.loads(request.content)["env"] == {"X": "y"}


def test_exec_stream_error_event(make_sandbox: MakeSandbox) -> None:
    body = 'event: stdout\ndata: {"chunk": "a"}\n\nevent: error\ndata: {"error": "guest vanished"}\n\n'
    sbx, _ = make_sandbox(lambda request: httpx.Response(200, content=body.encode()))
    stream = sbx.exec_stream("x")
    assert next(stream) == StreamEvent(kind="stdout", chunk="a")
    with pytest.raises(CryoboxError, match="guest vanished"):
        next(stream)


def test_exec_stream_http_error(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(409, "wrong_state", "sandbox is paused"))
    with pytest.raises(StateError, match="paused"):
        list(sbx.exec_stream("x"))


def test_filesystem_write_sends_raw_bytes(make_sandbox: MakeSandbox) -> None:
    payload = b"\x00\x01\xffbinary\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"path": request.url.params["path"], "bytes": len(request.content)})

    sbx, rec = make_sandbox(handler)
    assert sbx.filesystem.write("/work/data bin.dat", payload) == len(payload)
    assert sbx.filesystem.write("/work/t.txt", "héllo") == len("héllo".encode())
    first, second = rec.requests
    assert first.method == "PUT"
    assert first.url.path == "/v1/sandboxes/sbx_0123/fs"
    assert first.url.params["path"] == "/work/data bin.dat"
    assert first.content == payload
    assert first.headers["content-type"] == "application/octet-stream"
    assert second.content == "héllo".encode()


def test_filesystem_read_returns_raw_bytes(make_sandbox: MakeSandbox) -> None:
    payload = b"\xff\xfe\x00raw"
    sbx, rec = make_sandbox(lambda request: httpx.Response(200, content=payload))
    assert sbx.filesystem.read("/etc/blob") == payload
    (request,) = rec.requests
    assert request.method == "GET"
    assert request.url.path == "/v1/sandboxes/sbx_0123/fs"
    assert request.url.params["path"] == "/etc/blob"


def test_filesystem_read_not_found(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(404, "not_found", "no such file: /nope"))
    with pytest.raises(NotFound, match="/nope"):
        sbx.filesystem.read("/nope")


def test_filesystem_exists(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/sandboxes/sbx_0123/fs/stat"
        if request.url.params["path"] == "/missing":
            return error_response(404, "not_found", "no such file")
        if request.url.params["path"] == "/paused":
            return error_response(409, "wrong_state", "sandbox is paused")
        entry = {"name": "present", "is_dir": False, "size": 3, "mode": 0o100644, "mtime": 1.0}
        return httpx.Response(200, json=entry)

    sbx, _ = make_sandbox(handler)
    assert sbx.filesystem.exists("/missing") is False
    assert sbx.filesystem.exists("/present") is True
    with pytest.raises(StateError):
        sbx.filesystem.exists("/paused")


@pytest.mark.parametrize("status", [200, 204, 404])
def test_kill_succeeds_and_closes(make_sandbox: MakeSandbox, status: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if status == 404:
            return error_response(404, "not_found", "no such sandbox")
        return httpx.Response(status)

    sbx, rec = make_sandbox(handler)
    sbx.kill()
    (request,) = rec.requests
    assert request.method == "DELETE"
    assert request.url.path == "/v1/sandboxes/sbx_0123"
    assert sbx._http.is_closed


def test_kill_other_errors_raise_and_still_close(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(503, "capacity", "busy"))
    with pytest.raises(HostUnavailable):
        sbx.kill()
    assert sbx._http.is_closed


def test_context_manager_kills(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(204))
    with sbx as inner:
        assert inner is sbx
    assert [r.method for r in rec.requests] == ["DELETE"]


def test_public_surface() -> None:
    assert sorted(cryobox.__all__) == [
        "AsyncCodeContexts",
        "AsyncFilesystem",
        "AsyncForkTree",
        "AsyncProcess",
        "AsyncProcesses",
        "AsyncSandbox",
        "AsyncSnapshots",
        "CodeContext",
        "CodeContexts",
        "CommandFailed",
        "CryoboxError",
        "EgressDecision",
        "EgressLog",
        "ExecResult",
        "Execution",
        "ExecutionError",
        "Filesystem",
        "ForkTree",
        "ForkTreeError",
        "FsWatchEvent",
        "GuestError",
        "HostUnavailable",
        "InvalidArgument",
        "Logs",
        "NetworkPolicy",
        "NotFound",
        "PayloadTooLarge",
        "Process",
        "ProcessResult",
        "Processes",
        "PromoteFailure",
        "PromoteResult",
        "QuotaExceeded",
        "Result",
        "RetryPolicy",
        "Sandbox",
        "SandboxTimeout",
        "Snapshot",
        "Snapshots",
        "StateError",
        "StreamEvent",
        "Unauthorized",
        "VmmError",
        "WorkspaceQuotaExceeded",
        "__version__",
    ]
    for name in cryobox.__all__:
        assert hasattr(cryobox, name), name
    assert cryobox.Sandbox is Sandbox
    assert cryobox.AsyncSandbox is AsyncSandbox
    assert cryobox.RetryPolicy is RetryPolicy
    assert cryobox.Snapshot is models.Snapshot
    assert cryobox.NetworkPolicy is models.NetworkPolicy is cryobox.netpolicy.EgressPolicy


# --- configuration ---------------------------------------------------------------------------------------------


def test_config_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRYOBOX_API_URL", raising=False)
    monkeypatch.delenv("CRYOBOX_API_KEY", raising=False)
    assert ClientConfig.resolve() == ClientConfig(api_url=DEFAULT_URL, api_key="")
    monkeypatch.setenv("CRYOBOX_API_URL", "http://env:9000/")
    monkeypatch.setenv("CRYOBOX_API_KEY", "env-key")
    assert ClientConfig.resolve() == ClientConfig(api_url="http://env:9000", api_key="env-key")
    assert ClientConfig.resolve("http://arg:1", "arg-key", 5.0) == ClientConfig("http://arg:1", "arg-key", 5.0)


def test_config_client_options_send_bearer_key() -> None:
    options = ClientConfig("http://h:1", "secret", 42.0).client_options()
    assert options["base_url"] == "http://h:1"
    assert options["headers"]["Authorization"] == "Bearer secret"
    assert options["timeout"] == httpx.Timeout(42.0, connect=10.0)
    assert "Authorization" not in ClientConfig("http://h:1", "").client_options()["headers"]


# --- construction ----------------------------------------------------------------------------------------------


@pytest.fixture
def make_http() -> Iterator[Callable[[Handler], tuple[httpx.Client, Recorder]]]:
    clients: list[httpx.Client] = []

    def make(handler: Handler) -> tuple[httpx.Client, Recorder]:
        recorder = Recorder(handler)
        http = httpx.Client(transport=httpx.MockTransport(recorder), base_url="http://test")
        clients.append(http)
        return http, recorder

    yield make
    for client in clients:
        client.close()


MakeHttp = Callable[[Handler], tuple[httpx.Client, Recorder]]


def test_create_posts_body_and_returns_sandbox(make_http: MakeHttp) -> None:
    http, rec = make_http(created)
    sbx = Sandbox.create(
        "base",
        ttl_seconds=600,
        persistent=True,
        metadata={"owner": "tests"},
        env={"A": "1"},
        network={"egress": "allow", "allow": ["10.0.0.0/8"]},
        from_snapshot="snap_1",
        on_timeout="hibernate",
        auto_wake=False,
        volumes=[{"name": "data", "path": "/data"}],
        http=http,
    )
    assert isinstance(sbx.info, models.Sandbox)
    assert sbx.id == "sbx_0123"
    assert sbx._http is http
    (request,) = rec.requests
    assert (request.method, request.url.path) == ("POST", "/v1/sandboxes")
    assert json.loads(request.content) == {
        "template": "base",
        "ttl_seconds": 600,
        "persistent": True,
        "metadata": {"owner": "tests"},
        "env": {"A": "1"},
        "network": {"egress": "allow", "allow": ["10.0.0.0/8"]},
        "from_snapshot": "snap_1",
        "on_timeout": "hibernate",
        "auto_wake": False,
        "volumes": [{"name": "data", "path": "/data"}],
    }


def test_create_defaults(make_http: MakeHttp) -> None:
    http, rec = make_http(created)
    Sandbox.create(http=http)
    assert json.loads(rec.requests[0].content) == {
        "template": "code-interpreter",
        "persistent": False,
        "metadata": {},
        "env": {},
    }


def test_create_rejects_bad_network_before_sending(make_http: MakeHttp) -> None:
    http, rec = make_http(created)
    with pytest.raises(InvalidArgument, match="network"):
        Sandbox.create(network={"egress": "sometimes"}, http=http)
    assert rec.requests == []


def test_create_malformed_response_is_cryobox_error(make_http: MakeHttp) -> None:
    http, _ = make_http(lambda request: httpx.Response(201, json={"id": "sbx_1"}))
    with pytest.raises(CryoboxError, match="unexpected response to POST /v1/sandboxes") as info:
        Sandbox.create(http=http)
    assert type(info.value) is CryoboxError
    assert not http.is_closed  # a caller's client is the caller's to close on failure


def test_connect(make_http: MakeHttp) -> None:
    http, rec = make_http(lambda request: httpx.Response(200, json=INFO))
    sbx = Sandbox.connect("sbx_0123", http=http)
    assert sbx.info == models.Sandbox.model_validate(INFO)
    assert (rec.requests[0].method, rec.requests[0].url.path) == ("GET", "/v1/sandboxes/sbx_0123")


def test_connect_quotes_the_id(make_http: MakeHttp) -> None:
    http, rec = make_http(lambda request: error_response(404, "not_found", "no such sandbox"))
    with pytest.raises(NotFound):
        Sandbox.connect("../templates", http=http)
    assert rec.requests[0].url.raw_path == b"/v1/sandboxes/..%2Ftemplates"


def test_list_builds_filters(make_http: MakeHttp) -> None:
    http, rec = make_http(lambda request: httpx.Response(200, json={"items": [INFO, {**INFO, "id": "sbx_2"}]}))
    items = Sandbox.list(status="running", metadata={"owner": "tests", "team": "a b"}, http=http)
    assert [item.id for item in items] == ["sbx_0123", "sbx_2"]
    assert all(isinstance(item, models.Sandbox) for item in items)
    (request,) = rec.requests
    assert request.url.path == "/v1/sandboxes"
    assert dict(request.url.params) == {"status": "running", "metadata.owner": "tests", "metadata.team": "a b"}
    assert not http.is_closed


def test_list_without_filters_has_no_query(make_http: MakeHttp) -> None:
    http, rec = make_http(lambda request: httpx.Response(200, json={"items": []}))
    assert Sandbox.list(http=http) == []
    assert rec.requests[0].url.query == b""


# --- state and lifecycle ---------------------------------------------------------------------------------------


def test_refresh_updates_info(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(200, json={**INFO, "status": "paused"}))
    assert sbx.refresh().status == "paused"
    assert sbx.info.status == "paused"
    assert rec.requests[0].url.path == "/v1/sandboxes/sbx_0123"


def test_lifecycle(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(200, json=LIFECYCLE))
    assert sbx.lifecycle() == Lifecycle(
        ttl_seconds=600, persistent=True, idle_seconds=12.5, expires_at="2024-05-01T13:10:00Z"
    )
    assert (rec.requests[0].method, rec.requests[0].url.path) == ("GET", "/v1/sandboxes/sbx_0123/lifecycle")


def test_lifecycle_without_ttl(make_sandbox: MakeSandbox) -> None:
    body = {"ttl_seconds": None, "persistent": False, "idle_seconds": 0, "expires_at": None}
    sbx, _ = make_sandbox(lambda request: httpx.Response(200, json=body))
    assert sbx.lifecycle() == Lifecycle(ttl_seconds=None, persistent=False, idle_seconds=0.0, expires_at=None)


def test_set_ttl_and_persistent_patch(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(200, json=LIFECYCLE))
    assert sbx.set_ttl(600).ttl_seconds == 600
    assert sbx.set_persistent(True).persistent is True
    assert [(r.method, r.url.path) for r in rec.requests] == [("PATCH", "/v1/sandboxes/sbx_0123/lifecycle")] * 2
    assert [json.loads(r.content) for r in rec.requests] == [{"ttl_seconds": 600}, {"persistent": True}]
    assert sbx.info.persistent is True
    assert sbx.info.expires_at == "2024-05-01T13:10:00Z"


def test_set_timeout_action_patches_the_action_and_auto_wake(make_sandbox: MakeSandbox) -> None:
    answer = {**LIFECYCLE, "on_timeout": "hibernate", "auto_wake": False}
    sbx, rec = make_sandbox(lambda request: httpx.Response(200, json=answer))
    lifecycle = sbx.set_timeout_action("hibernate", auto_wake=False)
    assert (lifecycle.on_timeout, lifecycle.auto_wake, lifecycle.retained_until) == ("hibernate", False, None)
    assert json.loads(rec.requests[0].content) == {"on_timeout": "hibernate", "auto_wake": False}
    assert (sbx.info.on_timeout, sbx.info.auto_wake) == ("hibernate", False)


def test_malformed_lifecycle_is_cryobox_error(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: httpx.Response(200, json={"ttl_seconds": "soon"}))
    with pytest.raises(CryoboxError, match="unexpected response"):
        sbx.lifecycle()


def test_kill_keep_snapshots(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(204))
    sbx.kill(keep_snapshots=True)
    assert rec.requests[0].url.params["keep_snapshots"] == "true"


def test_close_keeps_sandbox(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: httpx.Response(204))
    sbx.close()
    assert rec.requests == []
    assert sbx._http.is_closed


def test_context_manager_keeps_the_original_exception(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(lambda request: error_response(500, "internal", "delete failed"))
    with pytest.raises(ValueError, match="body failed") as info, sbx:
        raise ValueError("body failed")
    assert any("delete failed" in note for note in info.value.__notes__)
    assert [r.method for r in rec.requests] == ["DELETE"]
    assert sbx._http.is_closed


# --- exec ------------------------------------------------------------------------------------------------------


def test_exec_read_timeout_covers_the_command(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(exec_ok(0))
    sbx.exec("sleep 500", timeout_seconds=600)
    sbx.exec("true", timeout_seconds=1)
    sbx.exec("forever", timeout_seconds=None)
    reads = [r.extensions["timeout"]["read"] for r in rec.requests]
    assert reads == [630.0, 300.0, None]


def test_exec_stream_callbacks(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse(SSE))
    out: list[str] = []
    err: list[str] = []
    events = list(sbx.exec_stream("x", on_stdout=out.append, on_stderr=err.append))
    assert out == ["hello ", "world\n"]
    assert err == ["warn\n"]
    assert events[-1] == StreamEvent(kind="exit", exit_code=7)


def test_exec_stream_without_exit_raises(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse(SSE_NO_EXIT))
    stream = sbx.exec_stream("x")
    assert next(stream) == StreamEvent(kind="stdout", chunk="partial")
    with pytest.raises(GuestError, match="ended before the command reported an exit code"):
        next(stream)


def test_exec_stream_empty_body_raises(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse(""))
    with pytest.raises(GuestError, match="exit code"):
        list(sbx.exec_stream("x"))


def test_exec_stream_error_event_maps_code(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse(SSE_TIMEOUT))
    seen: list[StreamEvent] = []
    with pytest.raises(SandboxTimeout, match="timed out"):
        for event in sbx.exec_stream("sleep 10", timeout_seconds=1):
            seen.append(event)
    assert seen == [StreamEvent(kind="stdout", chunk="a")]


def test_exec_stream_exit_without_trailing_blank_line(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(sse('event: ping\ndata: {}\n\nevent: exit\r\ndata:{"exit_code": 0}'))
    assert list(sbx.exec_stream("x")) == [StreamEvent(kind="exit", exit_code=0)]


def test_exec_stream_transport_error(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset", request=request)

    sbx, _ = make_sandbox(handler)
    with pytest.raises(CryoboxError, match="ReadError") as info:
        list(sbx.exec_stream("x"))
    assert type(info.value) is CryoboxError
    assert isinstance(info.value.__cause__, httpx.ReadError)


def test_sse_decoder() -> None:
    decoder = SSEDecoder()
    lines = [": comment", "event: stdout", "data: line one", "data:line two", "id: 7", "", "", "data: x", "\r"]
    messages = [message for line in lines if (message := decoder.feed(line)) is not None]
    assert messages == [SSEMessage("stdout", "line one\nline two"), SSEMessage("message", "x")]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("event: stdout\ndata: not json\n\n", "malformed"),
        ("event: stdout\ndata: [1]\n\n", "malformed"),
        ('event: exit\ndata: {"exit_code": "0"}\n\n', "without an integer exit_code"),
        ("event: exit\ndata: {}\n\n", "without an integer exit_code"),
    ],
)
def test_malformed_stream_is_guest_error(body: str, match: str) -> None:
    decoder = ExecStreamDecoder()
    with pytest.raises(GuestError, match=match):
        for line in [*body.split("\n"), ""]:
            decoder.feed(line)


@pytest.mark.parametrize(
    ("data", "cls"),
    [
        ({"error": "x", "code": "timeout"}, SandboxTimeout),
        ({"error": "x", "code": "guest_error"}, GuestError),
        ({"error": "x", "code": "wrong_state", "details": {"state": "paused"}}, StateError),
        ({"error": "x"}, CryoboxError),
        ({"error": "x", "code": "no_such_code"}, CryoboxError),
    ],
)
def test_stream_error_event_table(data: dict[str, Any], cls: type[CryoboxError]) -> None:
    decoder = ExecStreamDecoder()
    decoder.feed("event: error")
    decoder.feed("data: " + json.dumps(data))
    with pytest.raises(CryoboxError) as info:
        decoder.feed("")
    assert type(info.value) is cls
    assert info.value.message == "x"


# --- filesystem ------------------------------------------------------------------------------------------------


def test_filesystem_list_stat_remove_read_text(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/fs/dir"):
            return httpx.Response(200, json={"path": "/work", "entries": [ENTRY]})
        if request.url.path.endswith("/fs/stat"):
            return httpx.Response(200, json=ENTRY)
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, content="héllo".encode())

    sbx, rec = make_sandbox(handler)
    assert sbx.filesystem.list("/work") == [models.FileEntry.model_validate(ENTRY)]
    assert sbx.filesystem.stat("/work/a.txt").size == 3
    sbx.filesystem.remove("/work/a.txt")
    assert sbx.filesystem.read_text("/work/a.txt") == "héllo"
    assert [(r.method, r.url.path, r.url.params["path"]) for r in rec.requests] == [
        ("GET", "/v1/sandboxes/sbx_0123/fs/dir", "/work"),
        ("GET", "/v1/sandboxes/sbx_0123/fs/stat", "/work/a.txt"),
        ("DELETE", "/v1/sandboxes/sbx_0123/fs", "/work/a.txt"),
        ("GET", "/v1/sandboxes/sbx_0123/fs", "/work/a.txt"),
    ]


def test_filesystem_write_too_large(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: error_response(413, "payload_too_large", "body over 64 MiB"))
    with pytest.raises(PayloadTooLarge):
        sbx.filesystem.write("/big", b"x")


# --- transport errors ------------------------------------------------------------------------------------------


def _raise(exc_type: type[httpx.TransportError]) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc_type("boom", request=request)

    return handler


@pytest.mark.parametrize("exc_type", [httpx.ConnectError, httpx.ConnectTimeout])
def test_connect_failure_is_host_unavailable(make_http: MakeHttp, exc_type: type[httpx.TransportError]) -> None:
    http, rec = make_http(_raise(exc_type))
    with pytest.raises(HostUnavailable, match="cannot reach the cryobox API at http://test") as info:
        Sandbox.create(http=http, retry=FakeTime().policy())
    assert isinstance(info.value.__cause__, exc_type)
    assert len(rec.requests) == 1  # connection failures are not capacity refusals: never retried


@pytest.mark.parametrize("exc_type", [httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError])
def test_other_transport_failures_are_plain_errors(
    make_sandbox: MakeSandbox, exc_type: type[httpx.TransportError]
) -> None:
    sbx, _ = make_sandbox(_raise(exc_type))
    with pytest.raises(CryoboxError) as info:
        sbx.exec("true")
    assert type(info.value) is CryoboxError
    assert isinstance(info.value.__cause__, exc_type)


# --- capacity retry --------------------------------------------------------------------------------------------


def test_create_retries_capacity_honouring_retry_after(make_http: MakeHttp) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(capacity("2"), capacity("3"), capacity("1"), created))
    sbx = Sandbox.create(http=http, retry=fake.policy())
    assert sbx.id == "sbx_0123"
    assert len(rec.requests) == 4
    assert all((r.method, r.url.path) == ("POST", "/v1/sandboxes") for r in rec.requests)
    assert fake.jitter_caps == [1, 2, 4]
    assert fake.sleeps == [2 + 0.5, 3 + 1, 1 + 2]


def test_jitter_doubles_then_caps(make_http: MakeHttp) -> None:
    fake = FakeTime()
    http, _ = make_http(sequence(*[capacity("0")] * 7, created))
    Sandbox.create(http=http, retry=fake.policy(budget_s=1000))
    assert fake.jitter_caps == [1, 2, 4, 8, 15, 15, 15]


def test_retry_budget_exhausted_raises_last_refusal(make_http: MakeHttp) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(capacity("10"), capacity("10"), capacity("7", "third refusal"), created))
    with pytest.raises(HostUnavailable, match="third refusal") as info:
        Sandbox.create(http=http, retry=fake.policy(budget_s=25))
    # waits 10.5 and 11 fit in 25 s; the third (7 + 2) does not fit in the 3.5 s left, so it is not attempted
    assert fake.sleeps == [10.5, 11]
    assert len(rec.requests) == 3
    assert info.value.retry_after_s == 7


def test_retry_budget_counts_time_spent_in_requests(make_http: MakeHttp) -> None:
    fake = FakeTime()

    def slow_refusal(request: httpx.Request) -> httpx.Response:
        fake.now += 30
        return capacity("1")

    http, rec = make_http(sequence(slow_refusal, slow_refusal, created))
    with pytest.raises(HostUnavailable):
        Sandbox.create(http=http, retry=fake.policy(budget_s=60))
    assert fake.sleeps == [1.5]
    assert len(rec.requests) == 2


def test_zero_budget_disables_retry(make_http: MakeHttp) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(capacity("1"), created))
    with pytest.raises(HostUnavailable):
        Sandbox.create(http=http, retry=fake.policy(budget_s=0))
    assert fake.sleeps == []
    assert len(rec.requests) == 1


def test_rate_limit_with_retry_after_is_retried(make_http: MakeHttp) -> None:
    fake = FakeTime()
    limited = httpx.Response(429, json={"error": "slow down", "code": "rate_limited"}, headers={"Retry-After": "4"})
    http, rec = make_http(sequence(limited, created))
    Sandbox.create(http=http, retry=fake.policy())
    assert fake.sleeps == [4.5]
    assert len(rec.requests) == 2


def test_rate_limit_beyond_budget_carries_retry_after(make_http: MakeHttp) -> None:
    fake = FakeTime()
    limited = httpx.Response(429, json={"error": "slow down", "code": "rate_limited"}, headers={"Retry-After": "90"})
    http, _ = make_http(sequence(limited))
    with pytest.raises(QuotaExceeded) as info:
        Sandbox.create(http=http, retry=fake.policy())
    assert info.value.retry_after_s == 90
    assert fake.sleeps == []


@pytest.mark.parametrize(
    "refusal",
    [
        capacity(retry_after=None),  # no Retry-After
        httpx.Response(503, text="<html>Service Unavailable</html>", headers={"Retry-After": "1"}),  # not JSON
        httpx.Response(503, json={"detail": "busy"}, headers={"Retry-After": "1"}),  # JSON without "error"
        httpx.Response(503, json=["busy"], headers={"Retry-After": "1"}),  # JSON, not an object
        capacity(retry_after="whenever"),  # unparseable Retry-After
        httpx.Response(429, json={"error": "slow down", "code": "rate_limited"}),  # 429 without Retry-After
        error_response(500, "internal"),
        error_response(400, "invalid_argument"),
        error_response(404, "not_found", "no such template"),
    ],
)
def test_create_does_not_retry_other_refusals(make_http: MakeHttp, refusal: httpx.Response) -> None:
    fake = FakeTime()
    http, rec = make_http(sequence(refusal, created))
    with pytest.raises(CryoboxError) as info:
        Sandbox.create(http=http, retry=fake.policy())
    assert type(info.value) is type(error_from_response(refusal))
    assert fake.sleeps == []
    assert len(rec.requests) == 1


def test_non_create_requests_are_not_retried() -> None:
    fake = FakeTime()
    recorder = Recorder(lambda request: capacity("1"))
    with httpx.Client(transport=httpx.MockTransport(recorder), base_url="http://test") as http:
        sbx = Sandbox(models.Sandbox.model_validate(INFO), ClientConfig("http://test", "k"), http, retry=fake.policy())
        with pytest.raises(HostUnavailable):
            sbx.exec("true")
        with pytest.raises(HostUnavailable):
            sbx.filesystem.write("/a", "b")
        with pytest.raises(HostUnavailable):
            sbx.refresh()
    assert fake.sleeps == []
    assert len(recorder.requests) == 3


def test_retry_policy_validates() -> None:
    with pytest.raises(ValueError, match="budget_s"):
        RetryPolicy(budget_s=-1)
    assert RetryPolicy().budget_s == 60
    assert [RetryPolicy().jitter_cap(n) for n in range(7)] == [1, 2, 4, 8, 15, 15, 15]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("3", 3.0),
        ("1.5", 1.5),
        ("-4", 0.0),
        ("", None),
        (None, None),
        ("soon", None),
        ("nan", None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
    ],
)
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=1445412480.0) == seconds


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, InvalidArgument),
        (401, Unauthorized),
        (404, NotFound),
        (409, StateError),
        (413, PayloadTooLarge),
        (429, QuotaExceeded),
        (503, HostUnavailable),
        (504, SandboxTimeout),
        (418, CryoboxError),
        (502, CryoboxError),
    ],
)
def test_status_fallback_without_code(status: int, cls: type[CryoboxError]) -> None:
    error = error_from_response(httpx.Response(status, text="<html>proxy page</html>"))
    assert type(error) is cls
