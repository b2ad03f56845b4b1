"""The CLI in-process (typer's CliRunner) through the real SDK against a fake API: every HTTP client the commands
open gets an httpx.MockTransport (``ClientConfig.client_options`` is patched) answering ``(method, path)`` routes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from cryobox.cli.main import app
from cryobox.sdk import ClientConfig
from tests.support.sdk import Recorder, error_response

Reply = Callable[[httpx.Request], httpx.Response]


ENV = {"CRYOBOX_API_URL": "http://test", "CRYOBOX_API_KEY": "cli-key", "COLUMNS": "200"}


class FakeApi:
    """Answers ``(method, path)`` routes (anything else is a 404) and records the requests."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], httpx.Response | Reply] = {}
        self.recorder = Recorder(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        reply = self.routes.get((request.method, request.url.path))
        if reply is None:
            return error_response(404, "not_found", f"no route {request.method} {request.url.path}")
        if callable(reply):
            return reply(request)
        # a fresh copy per request: one Response object cannot be sent twice
        return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)

    def on(self, method: str, path: str, reply: httpx.Response | Reply) -> None:
        self.routes[(method, path)] = reply

    @property
    def requests(self) -> list[httpx.Request]:
        return self.recorder.requests

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.url.path) for r in self.requests]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    original = ClientConfig.client_options

    def client_options(self: ClientConfig) -> dict[str, Any]:
        return {**original(self), "transport": httpx.MockTransport(fake.recorder)}

    monkeypatch.setattr(ClientConfig, "client_options", client_options)
    return fake


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=ENV)


def ok(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body)


def expect_json(result: Result, code: int = 0) -> Any:
    assert result.exit_code == code, (result.stdout, result.stderr)
    return json.loads(result.stdout)
