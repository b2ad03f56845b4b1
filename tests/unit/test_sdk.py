"""SDK: error mapping at the HTTP boundary, and Sandbox over an httpx.MockTransport."""

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
    HostUnavailable,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxTimeout,
    StateError,
    Unauthorized,
)
from cryobox.sdk._transport import ClientConfig, raise_for_error
from cryobox.sdk.sandbox import ExecResult, Sandbox, StreamEvent

Handler = Callable[[httpx.Request], httpx.Response]


def _error(status: int, code: str, message: str = "boom", details: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": message, "code": code, "details": details or {}})


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
        raise_for_error(_error(status, code, f"it went wrong ({code})", {"sandbox_id": "sbx_1"}))
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
        raise_for_error(_error(503, "capacity"))
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
        raise_for_error(_error(405, "method_not_allowed", "Method Not Allowed"))
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
        raise_for_error(_error(409, "wrong_state", "sandbox is paused", {"state": "paused", "required": "running"}))
    assert info.value.details == {"state": "paused", "required": "running"}
    assert info.value.state == "paused"
    assert info.value.required == "running"


# --- Sandbox over MockTransport --------------------------------------------------------------------------------

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
}


class Recorder:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.handler(request)


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


def _exec_ok(exit_code: int) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"stdout": "out\n", "stderr": "err\n", "exit_code": exit_code, "duration_ms": 12.5}
        )

    return handler


def test_sandbox_info(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(_exec_ok(0))
    assert sbx.id == "sbx_0123"
    assert sbx.info.boot_mode == "restore"
    assert "sbx_0123" in repr(sbx)


def test_exec_posts_body_and_returns_result(make_sandbox: MakeSandbox) -> None:
    sbx, rec = make_sandbox(_exec_ok(0))
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
    sbx, rec = make_sandbox(_exec_ok(0))
    sbx.exec("true")
    assert json.loads(rec.requests[0].content) == {
        "cmd": "true",
        "timeout_seconds": 60.0,
        "env": {},
        "cwd": None,
        "stdin": None,
    }


def test_exec_nonzero_without_check_returns(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(_exec_ok(3))
    assert sbx.exec("exit 3").exit_code == 3


def test_exec_check_raises_command_failed(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(_exec_ok(3))
    with pytest.raises(CommandFailed) as info:
        sbx.exec("exit 3", check=True)
    assert info.value.exit_code == 3
    assert info.value.stdout == "out\n"
    assert info.value.stderr == "err\n"
    assert info.value.details == {"exit_code": 3}


def test_exec_check_passes_on_zero(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(_exec_ok(0))
    assert sbx.exec("true", check=True).exit_code == 0


def test_exec_timeout_error(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: _error(504, "timeout", "command timed out after 1s"))
    with pytest.raises(SandboxTimeout, match="timed out"):
        sbx.exec("sleep 10", timeout_seconds=1)


SSE = (
    'event: stdout\ndata: {"chunk": "hello "}\n\n'
    'event: stderr\ndata: {"chunk": "warn\\n"}\n\n'
    ": keep-alive comment\n\n"
    'event: stdout\ndata: {"chunk": "world\\n"}\n\n'
    'event: exit\ndata: {"exit_code": 7}\n\n'
    'event: stdout\ndata: {"chunk": "after exit"}\n\n'
)


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
    sbx, _ = make_sandbox(lambda request: _error(409, "wrong_state", "sandbox is paused"))
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
    sbx, _ = make_sandbox(lambda request: _error(404, "not_found", "no such file: /nope"))
    with pytest.raises(NotFound, match="/nope"):
        sbx.filesystem.read("/nope")


def test_filesystem_exists(make_sandbox: MakeSandbox) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/sandboxes/sbx_0123/fs/stat"
        if request.url.params["path"] == "/missing":
            return _error(404, "not_found", "no such file")
        if request.url.params["path"] == "/paused":
            return _error(409, "wrong_state", "sandbox is paused")
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
            return _error(404, "not_found", "no such sandbox")
        return httpx.Response(status)

    sbx, rec = make_sandbox(handler)
    sbx.kill()
    (request,) = rec.requests
    assert request.method == "DELETE"
    assert request.url.path == "/v1/sandboxes/sbx_0123"
    assert sbx._http.is_closed


def test_kill_other_errors_raise_and_still_close(make_sandbox: MakeSandbox) -> None:
    sbx, _ = make_sandbox(lambda request: _error(503, "capacity", "busy"))
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
        "CommandFailed",
        "CryoboxError",
        "ExecResult",
        "Filesystem",
        "GuestError",
        "HostUnavailable",
        "InvalidArgument",
        "NotFound",
        "PayloadTooLarge",
        "QuotaExceeded",
        "Sandbox",
        "SandboxTimeout",
        "StateError",
        "StreamEvent",
        "Unauthorized",
        "VmmError",
        "__version__",
    ]
    for name in cryobox.__all__:
        assert hasattr(cryobox, name), name
    assert cryobox.Sandbox is Sandbox
