"""An application written against E2B's code-interpreter SDK (``e2b-code-interpreter``, pinned), run unchanged
against ``cryobox serve`` (same variables as ``e2b_app.py``); prints one JSON report, every step's error reported
under its name instead of stopping the run."""

from __future__ import annotations

import base64
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from e2b_code_interpreter import Sandbox

REPORT: dict[str, Any] = {}


def step(name: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as err:
        REPORT[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=4)}
        return None
    REPORT[name] = value if isinstance(value, str | int | float | bool | list | dict | type(None)) else repr(value)
    REPORT.setdefault("_ms", {})[name] = round((time.monotonic() - started) * 1000, 1)
    return value


def main() -> int:
    sbx = step("create", lambda: Sandbox.create())
    try:
        if sbx is None:
            return 1
        step("first_1_plus_1", lambda: sbx.run_code("1+1").text)
        step("state", lambda: [sbx.run_code("x = 41").error is None, sbx.run_code("x + 1").text])

        def rich() -> dict[str, Any]:
            frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})").results[0]
            plot = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()").results[0]
            png = base64.b64decode(plot.png)
            return {"html_table": "<table" in (frame.html or ""), "png_sig": png[:8].hex(), "png_bytes": len(png)}

        step("rich", rich)

        def failing() -> dict[str, Any]:
            error = sbx.run_code("raise ValueError('bad value')").error
            after = sbx.run_code("x").text
            return {"name": error.name, "value": error.value, "tb": "ValueError" in error.traceback, "after": after}

        step("error", failing)

        def streamed() -> dict[str, Any]:
            chunks: list[str] = []
            results: list[Any] = []
            sbx.run_code(
                "print('a'); print('b'); 7", on_stdout=lambda m: chunks.append(m.line), on_result=results.append
            )
            return {"stdout": "".join(chunks), "result": results[0].text if results else None}

        step("callbacks", streamed)

        def contexts() -> dict[str, Any]:
            ctx = sbx.create_code_context()
            isolated = sbx.run_code("x", context=ctx).error
            sbx.run_code("y = 'in ctx'", context=ctx)
            listed = [c.id for c in sbx.list_code_contexts()]
            sbx.remove_code_context(ctx.id)
            return {"isolated": isolated.name if isolated else None, "listed": ctx.id in listed}

        step("contexts", contexts)
        step("timeout_then_works", lambda: _timeout(sbx))
        step("kill", sbx.kill)
    finally:
        print(json.dumps(REPORT, default=repr))
    return 0


def _timeout(sbx: Sandbox) -> dict[str, Any]:
    try:
        sbx.run_code("while True: pass", timeout=3)
        raised = None
    except Exception as err:  # the SDK raises its TimeoutException when the stream outlives ``timeout``
        raised = type(err).__name__
    time.sleep(0.5)
    return {"raised": raised, "after": sbx.run_code("x + 2").text}


if __name__ == "__main__":
    sys.exit(main())
