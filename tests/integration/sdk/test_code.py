"""The code interpreter on real VMs, through cryobox's SDK and PandaStack's unchanged SDK: a stateful kernel baked
warm into ``code-interpreter``, rich results, isolated contexts, errors and timeouts that keep the context, and
fork children that inherit the parent's kernel state and then diverge (their RNG reseeded, each its own)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pandastack
import pytest

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess


@pytest.fixture(scope="module")
def sbx(server: ServeProcess) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template="code-interpreter", api_url=server.url, api_key=server.api_key)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_state_rich_results_errors_and_timeouts(sbx: Sandbox) -> None:
    assert sbx.run_code("1 + 1").text == "2"
    assert sbx.run_code("import pandas\nwarm = 'pandas' in dir()\nx = 41").error is None  # imported at bake
    assert sbx.run_code("x + 1").text == "42"
    frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})").results[0]
    assert frame.html is not None and "<table" in frame.html and frame.is_main_result
    shown = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    png = base64.b64decode(shown.results[0].png or "")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    failed = sbx.run_code("raise KeyError('missing')")
    assert failed.error is not None and failed.error.name == "KeyError" and "missing" in failed.error.value
    assert "KeyError" in failed.error.traceback
    assert sbx.run_code("x").text == "41"  # the context survived the exception
    timed = sbx.run_code("while True: pass", timeout_seconds=2)
    assert timed.error is not None and timed.error.name == "TimeoutError"
    assert sbx.run_code("x + 2").text == "43"  # interrupted, not restarted
    seen: list[str] = []
    streamed = sbx.run_code("for i in range(3): print(i)", on_stdout=seen.append)
    assert "".join(seen) == "0\n1\n2\n" and streamed.logs.stdout
    assert sbx.exec("stat -c %U /home/user").stdout == "user\n"  # kernels run as E2B's default user


def test_contexts_are_isolated(sbx: Sandbox) -> None:
    ctx = sbx.code_contexts.create()
    try:
        missing = sbx.run_code("x", context=ctx)
        assert missing.error is not None and missing.error.name == "NameError"
        sbx.run_code("y = 'only here'", context=ctx)
        assert sbx.run_code("y", context=ctx).text == "'only here'"
        in_default = sbx.run_code("y")
        assert in_default.error is not None and in_default.error.name == "NameError"
        assert ctx.id in [c.id for c in sbx.code_contexts.list()]
    finally:
        sbx.code_contexts.remove(ctx)
    assert ctx.id not in [c.id for c in sbx.code_contexts.list()]


def test_fork_children_inherit_the_kernel_and_diverge(sbx: Sandbox) -> None:
    sbx.run_code("state = {'set_in': 'parent', 'n': 10}\nimport random")
    tree = sbx.fork_tree(4)
    try:
        assert not tree.errors and len(tree.children) == 4
        draws = []
        for index, child in enumerate(tree.children):
            assert child.run_code("state['set_in']").text == "'parent'"
            child.run_code(f"state['n'] += {index}")
            assert child.run_code("state['n']").text == str(10 + index)  # diverged after the fork
            draws.append(child.run_code("random.random()").text)
        assert len(set(draws)) == 4, f"fork children must not share RNG state: {draws}"
        assert sbx.run_code("state['n']").text == "10"  # the parent is untouched
    finally:
        for child in tree.children:
            child.kill()


def test_pandastack_sdk_code_context(server: ServeProcess) -> None:
    previous = pandastack.get_default_client() if hasattr(pandastack, "get_default_client") else None
    pandastack.set_default_client(pandastack.Client(api_url=server.url, api_key=server.api_key))
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    try:
        with sandbox.create_code_context() as ctx:
            ctx.run_code("z = 6 * 7")
            assert ctx.run_code("z").text == "42"
            plotted = ctx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
            assert base64.b64decode(plotted.png or "")[:4] == b"\x89PNG"
            broken = ctx.run_code("1/0")
            assert broken.error is not None and "ZeroDivisionError" in broken.error
            assert ctx.run_code("z + 1").text == "43"
    finally:
        sandbox.kill()
        if previous is not None:
            pandastack.set_default_client(previous)
