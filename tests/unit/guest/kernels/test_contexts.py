"""The guest's kernel contexts against real IPython kernels (the version Debian bookworm ships): state, rich
results, interrupts that keep the context, a caller going away, and the reseed after a restore."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.guest.kernels.contexts import ContextError, KernelContext


class Instance:
    """Stands in for /run/cryobox/instance-id (what the agent's resume writes)."""

    def __init__(self) -> None:
        self.value = "bake"

    def __call__(self) -> str:
        return self.value


@pytest.fixture(scope="module")
def instance() -> Instance:
    return Instance()


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory, instance: Instance) -> Iterator[KernelContext]:
    ctx = KernelContext(cwd=str(tmp_path_factory.mktemp("kernel")), instance=instance).start()
    try:
        yield ctx
    finally:
        ctx.shutdown()


def run(ctx: KernelContext, code: str, **kw: Any) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    ctx.execute(code, lines.append, **kw)
    return lines


def results(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == "result"]


def test_state_output_and_rich_results(context: KernelContext) -> None:
    lines = run(context, "x = 40\nprint('hello')\nx + 2")
    assert [line["type"] for line in lines] == ["stdout", "result", "number_of_executions"]
    assert lines[0]["text"] == "hello\n" and lines[1] == {"type": "result", "is_main_result": True, "text": "42"}
    assert results(run(context, "x"))[0]["text"] == "40"  # state kept
    frame = results(run(context, "import pandas as pd\npd.DataFrame({'a': [1, 2]})"))[0]
    assert "<table" in frame["html"] and frame["is_main_result"]
    shown = results(run(context, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"))
    png = base64.b64decode(shown[0]["png"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000 and shown[0]["is_main_result"] is False
    md = results(run(context, "from IPython.display import Markdown, display\ndisplay(Markdown('# hi'))"))[0]
    assert md["markdown"] == "# hi"


def test_errors_and_timeouts_keep_the_context(context: KernelContext) -> None:
    run(context, "kept = 'yes'")
    error = [line for line in run(context, "1 / 0") if line["type"] == "error"][0]
    assert error["name"] == "ZeroDivisionError" and "division by zero" in error["value"]
    assert "1 / 0" in error["traceback"] and "\x1b[" not in error["traceback"]
    timed = run(context, "while True: pass", timeout_s=1.0)
    assert [line["name"] for line in timed if line["type"] == "error"] == ["TimeoutError"]
    assert results(run(context, "kept"))[0]["text"] == "'yes'"  # interrupted, not restarted

    def gone(line: dict[str, Any]) -> None:
        raise BrokenPipeError("the caller went away")

    context.execute("import time\nprint('started')\ntime.sleep(600)", gone)  # returns: the cell was interrupted
    assert results(run(context, "kept"))[0]["text"] == "'yes'"
    calls = iter(range(5))
    quiet_then_gone = lambda: next(calls, -1) >= 0  # noqa: E731  (alive for 5 polls, then the caller is gone)
    context.execute("while True: pass", lambda line: None, alive=quiet_then_gone)  # no output, still interrupted
    assert results(run(context, "kept"))[0]["text"] == "'yes'"
    env = results(run(context, "import os\nos.environ['FROM_CALL']", env={"FROM_CALL": "v"}))
    assert env[0]["text"] == "'v'"


def test_a_restore_reseeds_unless_the_user_seeded(context: KernelContext, instance: Instance) -> None:
    draw = "import random, numpy\n(random.random(), float(numpy.random.rand()))"
    first = results(run(context, draw))[0]["text"]
    instance.value = "child-1"  # the guest came back as another instance: a fork child
    after = results(run(context, draw))[0]["text"]
    assert after != first
    run(context, "random.seed(7); numpy.random.seed(7)")
    seeded = results(run(context, draw))[0]["text"]
    run(context, "random.seed(7); numpy.random.seed(7)")
    instance.value = "child-2"
    assert results(run(context, draw))[0]["text"] == seeded  # the user's seed wins


def test_other_languages_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ContextError) as refused:
        KernelContext("r", str(tmp_path))
    assert refused.value.status == 400
