"""PandaStack's code-interpreter routes (``/v1/sandboxes/{id}/repl…``) driven by the unchanged ``pandastack`` SDK (a
sync ``requests`` client, so it runs in a worker thread against the app on uvicorn), over a fake agent whose
``code-interpreter`` sandboxes reach the REAL kernel server (see ``tests.support.kernels``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import pandastack
import pytest
from pandastack.exceptions import BadRequestError, NotFoundError
from pandastack.exceptions import SandboxTimeout as PandaTimeout

from cryobox.compat.pandastack.repl import mime_bundle, timed_out
from tests.support.app import Env, api, env, quota, registry
from tests.support.kernels import PNG_MAGIC, agent, cid, kernels
from tests.support.serving import served

__all__ = ["agent", "api", "cid", "env", "kernels", "quota", "registry", "served"]  # fixtures


@pytest.fixture
def key(env: Env) -> str:
    return env.client.headers["Authorization"].split()[1]


def client_of(served: str, key: str) -> pandastack.Client:
    return pandastack.Client(api_url=served, api_key=key, timeout=60, max_create_retry_seconds=0)


async def test_the_pandastack_sdk_gets_rich_results_and_keeps_state(served: str, key: str) -> None:
    def scenario() -> None:
        client = client_of(served, key)
        try:
            sandbox = client.sandboxes.create(template="code-interpreter")
            with sandbox.create_code_context() as ctx:
                assert ctx.id and ctx.language == "python"
                assert ctx.run_code("x = 41\nprint('set')").stdout == "set\n"
                answer = ctx.run_code("x + 1")
                assert answer.text == "42" and answer.error is None and answer.exit_code == 0
                assert answer.results[0].data == {"text/plain": "42"}

                table = ctx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
                assert table.results[0].html is not None and "<table" in table.results[0].html
                chart = ctx.run_code("import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()")
                assert chart.png is not None and base64.b64decode(chart.png).startswith(PNG_MAGIC)
                assert chart.results[0].chart == chart.png
                shown = ctx.run_code("from IPython.display import JSON, display\ndisplay(JSON({'k': 1}))")
                assert shown.results[0].json == {"k": 1}

                failed = ctx.run_code("1 / 0")
                assert failed.exit_code == 1 and failed.error is not None
                assert "ZeroDivisionError" in failed.error and "division by zero" in failed.error
                assert ctx.run_code("x").text == "41"  # the next cell works, the state is there

                started = time.monotonic()
                with pytest.raises(PandaTimeout):
                    ctx.run_code("while True: pass", timeout_seconds=1)
                assert time.monotonic() - started < 20
                assert ctx.run_code("x * 2").text == "82"  # the session survived its timeout

                with sandbox.create_code_context("py") as other:
                    isolated = other.run_code("x")
                    assert isolated.exit_code == 1 and isolated.error is not None and "NameError" in isolated.error
                closed_id = other.id
            with pytest.raises(NotFoundError):
                client._request("POST", f"/sandboxes/{sandbox.id}/repl/sessions/{closed_id}/run", json={"code": "1"})
            with pytest.raises(NotFoundError):  # the with block closed it
                client._request("POST", f"/sandboxes/{sandbox.id}/repl/sessions/{ctx.id}/run", json={"code": "1"})
        finally:
            client.session.close()

    await asyncio.to_thread(scenario)


async def test_a_base_sandbox_refuses_at_once(served: str, key: str, env: Env) -> None:
    sid = await env.made(template="base")

    def scenario() -> None:
        client = client_of(served, key)
        try:
            sandbox = client.sandboxes.get(sid)
            started = time.monotonic()
            with pytest.raises(BadRequestError, match="code-interpreter"):  # a 409: not retried as a warm-up
                sandbox.create_code_context()
            assert time.monotonic() - started < 5
        finally:
            client.session.close()

    await asyncio.to_thread(scenario)


async def test_one_shot_runs_in_the_default_context(api: httpx.AsyncClient, cid: str) -> None:
    url = f"/v1/sandboxes/{cid}/repl"
    first = await api.post(url, json={"code": "one_shot = 'kept'\none_shot", "language": "python"}, timeout=60)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["results"] == [{"text/plain": "'kept'"}] and body["exit_code"] == 0 and body["error"] is None
    assert isinstance(body["duration_ms"], int)
    code = await api.post(f"/v1/sandboxes/{cid}/code/run", json={"code": "one_shot"}, timeout=60)
    assert code.json()["results"][0]["text"] == "'kept'"  # the same default context as /code/run

    timed = await api.post(url, json={"code": "import time\ntime.sleep(30)", "timeout_ms": 1000}, timeout=60)
    assert timed.status_code == 504 and timed.json()["code"] == "timeout" and "timeout" in timed.json()["error"]
    assert (await api.post(url, json={"code": "one_shot"}, timeout=60)).json()["results"] == [{"text/plain": "'kept'"}]

    refused = await api.post(url, json={"code": "1", "language": "r"})
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_argument"
    bad = await api.post(url, json={"code": "1", "timeout_ms": 0})
    assert bad.status_code == 400
    unknown = await api.post(f"/v1/sandboxes/{cid}/repl/sessions/nope/run", json={"code": "1"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    assert (await api.delete(f"/v1/sandboxes/{cid}/repl/sessions/nope")).status_code == 404


async def test_a_timeout_error_the_cell_raises_itself_is_its_error(api: httpx.AsyncClient, cid: str) -> None:
    raised = await api.post(f"/v1/sandboxes/{cid}/repl", json={"code": "raise TimeoutError('mine')"}, timeout=60)
    assert raised.status_code == 200, raised.text
    assert raised.json()["exit_code"] == 1 and "TimeoutError: mine" in raised.json()["error"]


def test_mime_bundles_and_timeouts() -> None:
    result = {
        "is_main_result": True,
        "text": "x",
        "html": None,
        "png": "aGk=",
        "json": {"a": [1]},
        "extra": {"application/vnd.custom+json": {"b": 2}, "text/x-other": "y"},
    }
    assert mime_bundle(result) == {
        "text/plain": "x",
        "image/png": "aGk=",
        "application/json": json.dumps({"a": [1]}),
        "application/vnd.custom+json": json.dumps({"b": 2}),
        "text/x-other": "y",
    }
    stopped = {"name": "TimeoutError", "value": "execution timed out after 1s (interrupted)", "traceback": ""}
    assert timed_out(stopped) and timed_out({"name": "KernelRestarted", "value": "", "traceback": ""})
    assert not timed_out({**stopped, "traceback": "Traceback…"}) and not timed_out(None)
