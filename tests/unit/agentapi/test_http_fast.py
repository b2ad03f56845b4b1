"""The agent's plain routes (``agentapi.http_fast``) answer as FastAPI's would: the same requests sent to an app
with them and to one without (every operation a FastAPI route), sharing one fake agent, get the same status and
the same body, for good requests, for bodies that do not validate and for errors the agent raises."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from cryobox.agentapi import OPERATIONS, create_agent_app
from cryobox.agentapi import models as m
from cryobox.agentapi.http_fast import fits
from cryobox.agentapi.http_server import PREFIX
from cryobox.agentapi.operations import Arg
from cryobox.errors import HostUnavailable
from tests.support.fake_agent import FakeAgent

TOKEN = "token"
PLAIN = sorted(name for name, op in OPERATIONS.items() if fits(op))
WITH_BODY = [name for name in PLAIN if OPERATIONS[name].of(Arg.MODEL)]
BODILESS = [name for name in PLAIN if name not in WITH_BODY]
BAD_BODIES = [b"", b"{not json", b"[]", b"null", b"{}", b'{"cmd": 7, "sandbox_id": []}', b'{"cmd":"x"']
JSON = {"Content-Type": "application/json"}


class Failing(FakeAgent):
    """The fake, whose ``exec`` raises :attr:`error` when one is set."""

    error: Exception | None = None

    async def exec(self, sandbox_id: str, request: m.ExecRequest) -> m.ExecResult:
        if self.error is not None:
            raise self.error
        return await super().exec(sandbox_id, request)


@dataclass(frozen=True)
class Both:
    fake: Failing
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient]
    """With the plain routes, and without them."""


@pytest.fixture
async def both() -> AsyncIterator[Both]:
    fake = Failing()
    clients = [
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_agent_app(fake, TOKEN, plain_routes=plain)),
            base_url="http://agent",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        for plain in (True, False)
    ]
    yield Both(fake, (clients[0], clients[1]))
    for client in clients:
        await client.aclose()


VOLATILE = {"idle_s"}
"""Reply fields that change from one call to the next (the second call comes a moment later)."""


def steady(answer: httpx.Response) -> Any:
    body = answer.json()
    return {k: v for k, v in body.items() if k not in VOLATILE} if isinstance(body, dict) else body


async def same(clients: tuple[httpx.AsyncClient, httpx.AsyncClient], method: str, path: str, **kw: Any) -> Any:
    plain, fastapi = [await c.request(method, path, **kw) for c in clients]
    assert (plain.status_code, plain.content) == (fastapi.status_code, fastapi.content) or (
        plain.status_code == fastapi.status_code
        and plain.headers.get("content-type") == fastapi.headers.get("content-type")
        and steady(plain) == steady(fastapi)
    ), (method, path, plain.text, fastapi.text)
    assert plain.headers.get("retry-after") == fastapi.headers.get("retry-after")
    return plain


def example(name: str, ids: str = "x1") -> str:
    op = OPERATIONS[name]
    assert op.path is not None
    return PREFIX + re.sub(r"\{[^}]+\}", ids, op.path)


def test_the_hot_operations_are_plain() -> None:
    assert {"exec", "create", "get", "delete", "info", "capacity"} <= set(PLAIN)
    assert not {"exec_stream", "write_file", "read_file", "metrics_text"} & set(PLAIN)


def valid(model: type[BaseModel], body: bytes, headers: dict[str, str]) -> bool:
    try:
        model.model_validate_json(body)
    except ValidationError:
        return False
    return headers == JSON


@pytest.mark.parametrize("name", WITH_BODY)
async def test_bodies_that_do_not_validate(both: Both, name: str) -> None:
    op = OPERATIONS[name]
    for body in BAD_BODIES:
        for headers in (JSON, {}, {"Content-Type": "text/plain"}):  # a body not declared JSON is not read as JSON
            answer = await same(both.clients, op.method, example(name), content=body, headers=headers)
            if not valid(op.of(Arg.MODEL)[0].annotation, body, headers):  # else: the fake's answer (404), alike
                assert answer.status_code == 400 and answer.json()["code"] == "invalid_argument", (name, body)


@pytest.mark.parametrize("name", BODILESS)
async def test_unknown_ids_and_bodiless_calls(both: Both, name: str) -> None:
    await same(both.clients, OPERATIONS[name].method, example(name, "no-such-thing"))


async def test_a_sandbox_through_both(both: Both) -> None:
    fake, clients = both.fake, both.clients
    spec = m.CreateSpec(sandbox_id="sb-1", template="base", workspace_id="ws")
    created = await same(clients, "POST", example("create"), content=spec.model_dump_json(), headers=JSON)
    assert created.status_code == 200 and created.json()["id"] == "sb-1"
    await same(clients, "GET", example("get", "sb-1"))
    run = m.ExecRequest(cmd="echo hi")
    answer = await same(clients, "POST", example("exec", "sb-1"), content=run.model_dump_json(), headers=JSON)
    assert answer.status_code == 200 and "exit_code" in answer.json()
    await same(clients, "POST", example("exec", "sb-none"), content=run.model_dump_json(), headers=JSON)  # not found
    fake.error = RuntimeError("a bug")
    answer = await same(clients, "POST", example("exec", "sb-1"), content=run.model_dump_json(), headers=JSON)
    assert answer.status_code == 500 and answer.json() == {"error": "internal error", "code": "internal", "details": {}}
    fake.error = HostUnavailable("draining", retry_after_s=2.5, details={"why": "test"})
    answer = await same(clients, "POST", example("exec", "sb-1"), content=run.model_dump_json(), headers=JSON)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "3"
    deleted = await same(clients, "DELETE", example("delete", "sb-1"))
    assert deleted.status_code == 204
