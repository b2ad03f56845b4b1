"""``/v1/sandboxes/{id}/code/…`` against the REAL in-guest kernel server (``cryobox.guest.kernels``: Jupyter kernels
behind E2B's code-interpreter protocol) run in this process on 127.0.0.1, reached through a fake agent's
``port_target`` and the control plane's port-proxy client, as in a sandbox. Streaming is checked on a uvicorn server
(the ASGI transport buffers whole responses).

The fixtures (``kernels``, ``agent``, ``cid``: tests/support/kernels.py) serve the SDK's (tests/unit/sdk/test_code.py)
and PandaStack's REPL tests (tests/unit/compat/pandastack/test_repl.py) too.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox.agentapi import models as am
from cryobox.errors import GuestError, HostUnavailable, InvalidArgument, NotFound, StateError
from cryobox.sdk._sse import SSEDecoder
from cryobox.server.routes import code_client
from cryobox.server.routes.code_client import CodeClient, collect, primed
from tests.support.app import Env, api, env, quota, registry
from tests.support.kernels import PNG_MAGIC, KernelAgent, agent, cid, closed_port_url, kernels
from tests.support.serving import served

__all__ = ["agent", "api", "cid", "env", "kernels", "quota", "registry", "served"]  # fixtures

Event = tuple[str, dict[str, Any]]


async def run(api: httpx.AsyncClient, sid: str, code: str, **body: Any) -> dict[str, Any]:
    response = await api.post(f"/v1/sandboxes/{sid}/code/run", json={"code": code, **body}, timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["error"]
    return body


# --- running cells ----------------------------------------------------------------------------------------------


async def test_state_is_kept_across_cells_and_outputs_are_rich(api: httpx.AsyncClient, cid: str) -> None:
    first = await run(api, cid, "answer = 41\nprint('set', flush=True)")
    assert first["stdout"] == "set\n" and first["results"] == [] and first["error"] is None
    second = await run(api, cid, "import sys; print('oops', file=sys.stderr); answer + 1")
    assert second["stderr"] == "oops\n" and second["execution_count"] == first["execution_count"] + 1
    (result,) = second["results"]
    assert result["is_main_result"] is True and result["text"] == "42" and result["html"] is None
    assert second["duration_ms"] > 0

    table = await run(api, cid, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    (frame,) = table["results"]
    assert "<table" in frame["html"] and frame["is_main_result"] is True and "a" in frame["text"]

    chart = await run(api, cid, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    pngs = [r for r in chart["results"] if r["png"]]
    assert len(pngs) == 1 and pngs[0]["is_main_result"] is False
    assert base64.b64decode(pngs[0]["png"]).startswith(PNG_MAGIC)

    shown = await run(api, cid, "from IPython.display import JSON, display\ndisplay(JSON({'k': [1, 2]}))")
    assert shown["results"][0]["json"] == {"k": [1, 2]}


async def test_an_exception_is_reported_and_the_next_cell_works(api: httpx.AsyncClient, cid: str) -> None:
    failed = await run(api, cid, "kept = 'still here'\n1 / 0")
    assert failed["error"]["name"] == "ZeroDivisionError" and failed["error"]["value"] == "division by zero"
    assert "ZeroDivisionError" in failed["error"]["traceback"] and "\x1b[" not in failed["error"]["traceback"]
    assert failed["results"] == []
    again = await run(api, cid, "kept")
    assert again["error"] is None and again["results"][0]["text"] == "'still here'"


async def test_a_timeout_interrupts_the_cell_and_the_context_survives(api: httpx.AsyncClient, cid: str) -> None:
    await run(api, cid, "before_timeout = 7")
    stuck = await run(api, cid, "while True: pass", timeout_seconds=1)
    assert stuck["error"]["name"] == "TimeoutError" and "timed out" in stuck["error"]["value"]
    assert 900 < stuck["duration_ms"] < 15_000
    after = await run(api, cid, "before_timeout * 6")
    assert after["error"] is None and after["results"][0]["text"] == "42"


async def test_a_cell_printing_past_its_timeout_is_cut_off(
    api: httpx.AsyncClient, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server checks a cell's deadline only while it is quiet (so far): the control plane cuts a chatty one off
    (``cut off``) if the server did not interrupt it (``interrupted``) by its timeout plus the grace."""
    monkeypatch.setattr(code_client, "HARD_GRACE_S", 1.0)
    made = await api.post(f"/v1/sandboxes/{cid}/code/contexts", json={}, timeout=60)
    context_id = made.json()["id"]
    await run(api, cid, "chatty_state = 'kept'", context_id=context_id)
    chatty = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.02)"
    cut = await run(api, cid, chatty, timeout_seconds=1, context_id=context_id)
    assert cut["error"]["name"] == "TimeoutError" and "timed out after 1s" in cut["error"]["value"]
    assert cut["stdout"].startswith("tick\n") and cut["duration_ms"] < 15_000
    after = await run(api, cid, "chatty_state", context_id=context_id)  # interrupted at its next output
    assert after["results"][0]["text"] == "'kept'"
    assert (await api.delete(f"/v1/sandboxes/{cid}/code/contexts/{context_id}")).status_code == 204


async def test_env_is_set_for_the_cell(api: httpx.AsyncClient, cid: str) -> None:
    answer = await run(api, cid, "import os\nos.environ['CODE_ROUTE_VAR']", env={"CODE_ROUTE_VAR": "v1"})
    assert answer["results"][0]["text"] == "'v1'"


async def test_bad_requests_are_400_and_reach_no_kernel(api: httpx.AsyncClient, cid: str, agent: KernelAgent) -> None:
    before = agent.call_names().count("port_target")
    for body in ({}, {"code": 1}, {"code": "1", "timeout_seconds": 0}, {"code": "1", "context_id": "a/b"}):
        error(await api.post(f"/v1/sandboxes/{cid}/code/run", json=body), 400, "invalid_argument")
    assert agent.call_names().count("port_target") == before
    error(await api.post("/v1/sandboxes/nope/code/run", json={"code": "1"}), 404, "not_found")


# --- contexts ---------------------------------------------------------------------------------------------------


async def test_contexts_are_isolated_listed_restarted_and_removed(api: httpx.AsyncClient, cid: str) -> None:
    await run(api, cid, "shared_name = 'default context'")
    made = await api.post(f"/v1/sandboxes/{cid}/code/contexts", json={"language": "python"}, timeout=60)
    assert made.status_code == 201, made.text
    context = made.json()
    assert context["language"] == "python" and context["id"] and context["cwd"]
    listed = (await api.get(f"/v1/sandboxes/{cid}/code/contexts")).json()["items"]
    assert {c["id"] for c in listed} >= {"default", context["id"]}

    isolated = await run(api, cid, "shared_name", context_id=context["id"])
    assert isolated["error"]["name"] == "NameError"
    await run(api, cid, "own = 1", context_id=context["id"])
    assert (await run(api, cid, "own", context_id=context["id"]))["results"][0]["text"] == "1"
    assert (await run(api, cid, "shared_name"))["results"][0]["text"] == "'default context'"

    restarted = await api.post(f"/v1/sandboxes/{cid}/code/contexts/{context['id']}/restart", timeout=60)
    assert restarted.status_code == 204, restarted.text
    assert (await run(api, cid, "own", context_id=context["id"]))["error"]["name"] == "NameError"

    removed = await api.delete(f"/v1/sandboxes/{cid}/code/contexts/{context['id']}")
    assert removed.status_code == 204, removed.text
    gone = await api.post(f"/v1/sandboxes/{cid}/code/run", json={"code": "1", "context_id": context["id"]})
    error(gone, 404, "not_found")
    error(await api.delete(f"/v1/sandboxes/{cid}/code/contexts/{context['id']}"), 404, "not_found")
    error(await api.delete(f"/v1/sandboxes/{cid}/code/contexts/default"), 400, "invalid_argument")
    error(await api.post(f"/v1/sandboxes/{cid}/code/contexts/nope/restart"), 404, "not_found")
    error(await api.post(f"/v1/sandboxes/{cid}/code/contexts", json={"language": "r"}), 400, "invalid_argument")
    assert context["id"] not in {c["id"] for c in (await api.get(f"/v1/sandboxes/{cid}/code/contexts")).json()["items"]}


async def test_a_sandbox_without_a_code_interpreter_is_409(api: httpx.AsyncClient, env: Env) -> None:
    sid = await env.made(template="base")
    for response in (
        await api.post(f"/v1/sandboxes/{sid}/code/run", json={"code": "1"}),
        await api.post(f"/v1/sandboxes/{sid}/code/run/stream", json={"code": "1"}),
        await api.get(f"/v1/sandboxes/{sid}/code/contexts"),
        await api.post(f"/v1/sandboxes/{sid}/code/contexts", json={}),
    ):
        body = error(response, 409, "wrong_state")
        assert "'base'" in body["error"] and "code-interpreter" in body["error"] and "49999" in body["error"]
        assert response.headers["content-type"].startswith("application/json")


# --- streaming --------------------------------------------------------------------------------------------------


class Events:
    """Reads a live event stream one event at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()
        self._decoder = SSEDecoder()

    async def next(self) -> Event:
        async with asyncio.timeout(30):
            async for line in self._lines:
                message = self._decoder.feed(line)
                if message is not None:
                    return message.event, json.loads(message.data)
        raise AssertionError("the stream ended")


async def test_the_stream_delivers_output_while_the_cell_runs(served: str, env: Env, cid: str, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    code = (
        "import os, time\nprint('first', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
        "print('second', flush=True)\n6 * 7"
    )
    headers = {"Authorization": env.client.headers["Authorization"]}
    async with httpx.AsyncClient(base_url=served, headers=headers, timeout=60) as live:
        url = f"/v1/sandboxes/{cid}/code/run/stream"
        async with live.stream("POST", url, json={"code": code, "timeout_seconds": 30}) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            events = Events(response)
            assert await events.next() == ("stdout", {"text": "first\n"})  # the cell is still waiting for the flag
            flag.touch()
            assert await events.next() == ("stdout", {"text": "second\n"})
            kind, result = await events.next()
            assert kind == "result" and result["text"] == "42" and result["is_main_result"] is True
            kind, end = await events.next()
            assert kind == "end" and end["execution_count"] >= 1 and end["duration_ms"] > 0

        async with live.stream("POST", url, json={"code": "print('x')\nraise ValueError('bad value')"}) as response:
            events = Events(response)
            assert (await events.next())[0] == "stdout"
            kind, raised = await events.next()
            assert kind == "error" and raised["name"] == "ValueError" and raised["value"] == "bad value"
            assert (await events.next())[0] == "end"

        missing = await live.post(url, json={"code": "1", "context_id": "nope"})
        error(missing, 404, "not_found")  # before the first event: a plain error response


# --- the client's error boundary ----------------------------------------------------------------------------------


def mock_client(handler: Any) -> CodeClient:
    agent = KernelAgent("http://kernels.invalid")
    agent.sandboxes["s"] = am.SandboxInfo(
        id="s", template="code-interpreter", cpus=1, memory_mib=512, state="running", workspace_id="w", created_at=0
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return CodeClient(agent, "s", http, template="code-interpreter")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (404, {"error": "context x not found"}, NotFound),
        (400, {"error": "'code' must be a string"}, InvalidArgument),
        (409, {"error": "context has no kernel"}, StateError),
        (500, {"error": "kernel did not start"}, GuestError),
        (502, {"error": "port is not open: nothing accepted a connection", "code": "port_unreachable"}, StateError),
        (503, b"<html>no</html>", GuestError),
        (401, {"error": "missing node token", "code": "unauthorized"}, GuestError),  # an agent's, not the caller's
        (503, {"error": "no capacity", "code": "capacity"}, HostUnavailable),
    ],
)
async def test_answers_are_translated_at_the_boundary(status: int, body: Any, expected: type[Exception]) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    client = mock_client(lambda request: httpx.Response(status, content=content))
    with pytest.raises(expected) as raised:
        await client.contexts()
    assert type(raised.value) is expected
    with pytest.raises(expected):
        await primed(client.execute("1"))
    await client.http.aclose()


async def test_malformed_or_truncated_streams_are_guest_errors() -> None:
    lines = [b'{"type": "stdout", "text": "a"}\n', b"not json\n"]
    client = mock_client(lambda request: httpx.Response(200, content=b"".join(lines)))
    with pytest.raises(GuestError, match="malformed"):
        await collect(client.execute("1"))
    truncated = mock_client(lambda request: httpx.Response(200, content=lines[0]))
    with pytest.raises(GuestError, match="ended before the cell finished"):
        await collect(truncated.execute("1"))
    for made in (client, truncated):
        await made.http.aclose()


async def test_nothing_listening_is_a_state_error_naming_the_template() -> None:
    agent = KernelAgent(closed_port_url())
    agent.sandboxes["s"] = am.SandboxInfo(
        id="s", template="code-interpreter", cpus=1, memory_mib=512, state="running", workspace_id="w", created_at=0
    )
    async with httpx.AsyncClient() as http:
        client = CodeClient(agent, "s", http, template="base")
        with pytest.raises(StateError, match="template 'base'"):
            await client.create_context()
        with pytest.raises(StateError, match="nothing listens on port 49999"):
            await primed(client.execute("1"))
