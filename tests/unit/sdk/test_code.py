"""SDK: ``sbx.run_code`` and ``sbx.code_contexts``, async and sync, against the real app on uvicorn over a fake
agent whose ``code-interpreter`` sandboxes reach the REAL kernel server (see ``tests.support.kernels``).

The sync client blocks, so its calls run in a worker thread while the loop serves them.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cryobox import (
    AsyncCodeContexts,
    AsyncSandbox,
    CodeContext,
    CodeContexts,
    Execution,
    ExecutionError,
    GuestError,
    InvalidArgument,
    Logs,
    NotFound,
    Result,
    Sandbox,
    StateError,
)
from cryobox.sdk._async.code import AsyncCodeInterpreter
from cryobox.sdk._code import ExecutionStream
from cryobox.sdk._sync.code import CodeInterpreter
from tests.support.app import Env, env, quota, registry
from tests.support.kernels import PNG_MAGIC, agent, cid, kernels
from tests.support.serving import served

__all__ = ["agent", "cid", "env", "kernels", "quota", "registry", "served"]  # fixtures


@pytest.fixture
def key(env: Env) -> str:
    return env.client.headers["Authorization"].split()[1]


@pytest.fixture
async def sbx(served: str, key: str, cid: str) -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.connect(cid, api_url=served, api_key=key, timeout_s=60)
    yield sandbox
    await sandbox.aclose()


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("sync_cls", "async_cls"), [(CodeContexts, AsyncCodeContexts), (CodeInterpreter, AsyncCodeInterpreter)]
)
def test_same_methods_as_sync(sync_cls: type, async_cls: type) -> None:
    assert _public(async_cls) == _public(sync_cls)
    for name in _public(async_cls) - {"code_contexts"}:
        attr = inspect.getattr_static(async_cls, name)
        assert inspect.iscoroutinefunction(attr), name
    assert issubclass(AsyncSandbox, AsyncCodeInterpreter) and issubclass(Sandbox, CodeInterpreter)


# --- async ------------------------------------------------------------------------------------------------------


async def test_state_persists_and_outputs_arrive_as_the_cell_runs(sbx: AsyncSandbox, tmp_path: Path) -> None:
    first = await sbx.run_code("counter = 41")
    assert isinstance(first, Execution) and first.error is None and first.results == [] and first.text is None
    flag = tmp_path / "seen"
    code = (
        "import os, sys, time\nprint('ready', flush=True)\nprint('warn', file=sys.stderr, flush=True)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
        "counter + 1"
    )
    seen: list[str] = []
    results: list[Result] = []

    def on_stdout(text: str) -> None:
        seen.append(text)
        flag.touch()  # the cell waits for this: it only returns if the line came while it was running

    second = await sbx.run_code(
        code, timeout_seconds=30, on_stdout=on_stdout, on_stderr=seen.append, on_result=results.append
    )
    assert second.error is None, second.error
    assert seen == ["ready\n", "warn\n"] and second.logs == Logs(stdout=["ready\n"], stderr=["warn\n"])
    assert second.text == "42" and results == second.results and results[0].is_main_result
    assert second.execution_count == (first.execution_count or 0) + 1 and second.duration_ms > 0


async def test_rich_results(sbx: AsyncSandbox) -> None:
    table = await sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3.5, 4.5]})")
    (frame,) = table.results
    assert frame.html is not None and "<table" in frame.html and frame.formats() == ["text", "html"]
    chart = await sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 4])\nplt.show()")
    (figure,) = [r for r in chart.results if r.png is not None]
    assert figure.png is not None and base64.b64decode(figure.png).startswith(PNG_MAGIC)
    assert not figure.is_main_result and chart.text is None and "png" in figure.formats()
    shown = await sbx.run_code(
        "from IPython.display import JSON, Markdown, display\ndisplay(JSON({'n': 1}), Markdown('*hi*'))"
    )
    assert [r.json for r in shown.results] == [{"n": 1}, None] and shown.results[1].markdown == "*hi*"


async def test_an_exception_is_an_error_and_the_next_cell_works(sbx: AsyncSandbox) -> None:
    errors: list[ExecutionError] = []
    failed = await sbx.run_code("survivor = 3\nraise KeyError('missing')", on_error=errors.append)
    assert failed.error is not None and errors == [failed.error]
    assert (failed.error.name, failed.error.value) == ("KeyError", "'missing'")
    assert "KeyError" in failed.error.traceback and "raise KeyError" in failed.error.traceback
    assert (await sbx.run_code("survivor * 2")).text == "6"


async def test_a_timeout_interrupts_and_the_context_keeps_its_state(sbx: AsyncSandbox) -> None:
    await sbx.run_code("slow_state = 'kept'")
    stuck = await sbx.run_code("while True: pass", timeout_seconds=1)
    assert stuck.error is not None and stuck.error.name == "TimeoutError"
    assert (await sbx.run_code("slow_state")).text == "'kept'"
    env_cell = await sbx.run_code("import os\nos.environ['SDK_CODE_VAR']", env={"SDK_CODE_VAR": "set"})
    assert env_cell.text == "'set'"


async def test_contexts(sbx: AsyncSandbox) -> None:
    await sbx.run_code("only_in_default = 1")
    made = await sbx.code_contexts.create()
    assert isinstance(made, CodeContext) and made.language == "python" and made.id != "default"
    assert {c.id for c in await sbx.code_contexts.list()} >= {"default", made.id}
    isolated = await sbx.run_code("only_in_default", context=made)
    assert isolated.error is not None and isolated.error.name == "NameError"
    await sbx.run_code("mine = 'ctx'", context=made.id)  # an id does as well as the object
    assert (await sbx.run_code("mine", context=made)).text == "'ctx'"
    await sbx.code_contexts.restart(made)
    restarted = await sbx.run_code("mine", context=made)
    assert restarted.error is not None and restarted.error.name == "NameError"
    await sbx.code_contexts.remove(made)
    with pytest.raises(NotFound):
        await sbx.run_code("1", context=made)
    with pytest.raises(NotFound):
        await sbx.code_contexts.remove(made)
    with pytest.raises(InvalidArgument):
        await sbx.code_contexts.remove("default")
    with pytest.raises(InvalidArgument):
        await sbx.code_contexts.create(language="cobol")
    assert made.id not in {c.id for c in await sbx.code_contexts.list()}


async def test_a_sandbox_without_a_code_interpreter_raises_state_error(served: str, key: str, env: Env) -> None:
    sid = await env.made(template="base")
    async with await AsyncSandbox.connect(sid, api_url=served, api_key=key, timeout_s=30) as base:
        with pytest.raises(StateError, match="code-interpreter"):
            await base.run_code("1")
        with pytest.raises(StateError):
            await base.code_contexts.create()


# --- sync -------------------------------------------------------------------------------------------------------


async def test_sync_client(served: str, key: str, cid: str) -> None:
    def scenario() -> None:
        with Sandbox.connect(cid, api_url=served, api_key=key, timeout_s=60) as sandbox:
            printed: list[str] = []
            assert (
                sandbox.run_code("sync_value = 20\nprint('p')\nsync_value * 2", on_stdout=printed.append).text == "40"
            )
            assert printed == ["p\n"]
            scratch = sandbox.code_contexts.create()
            isolated = sandbox.run_code("sync_value", context=scratch)
            assert isolated.error is not None and isolated.error.name == "NameError"
            assert scratch.id in {c.id for c in sandbox.code_contexts.list()}
            sandbox.code_contexts.remove(scratch)
            timed = sandbox.run_code("import time\ntime.sleep(30)", timeout_seconds=1)
            assert timed.error is not None and timed.error.name == "TimeoutError"
            assert sandbox.run_code("sync_value").text == "20"

    await asyncio.to_thread(scenario)


# --- decoding (no IO) -------------------------------------------------------------------------------------------


def feed(stream: ExecutionStream, text: str) -> bool:
    done = False
    for line in [*text.splitlines(), ""]:
        done = stream.feed(line) or done
    return done


def test_a_failure_event_raises_the_mapped_error_and_a_truncated_stream_is_a_guest_error() -> None:
    stream = ExecutionStream()
    assert not feed(stream, 'event: stdout\ndata: {"text": "a"}\n')
    with pytest.raises(StateError, match="gone"):
        feed(stream, 'event: failure\ndata: {"error": "gone", "code": "wrong_state", "details": {}}\n')
    with pytest.raises(GuestError, match="ended before the cell finished"):
        stream.execution()
    done = ExecutionStream()
    assert feed(done, 'event: result\ndata: {"text": "1", "is_main_result": true, "extra": {"a/b": 1}}\n') is False
    assert feed(done, 'event: end\ndata: {"execution_count": 3, "duration_ms": 1.5}\n')
    execution = done.execution()
    assert (
        execution.execution_count == 3 and execution.text == "1" and execution.results[0].formats() == ["text", "a/b"]
    )
    with pytest.raises(GuestError, match="malformed"):
        feed(ExecutionStream(), "event: stdout\ndata: nope\n")
