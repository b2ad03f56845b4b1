"""The sandbox page's "at timeout" fact (``js/lifecycle.js``), run under Node (``tests/support/nodejs.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.support.nodejs import run_module


def test_the_timeout_action_reads_as_what_happens(tmp_path: Path) -> None:
    out = run_module(
        tmp_path,
        """
import { timeoutText } from "./lifecycle.js";
console.log(JSON.stringify([
  timeoutText({}),
  timeoutText({ on_timeout: "kill" }),
  timeoutText({ on_timeout: "hibernate", auto_wake: true }),
  timeoutText({ on_timeout: "hibernate", auto_wake: false }),
  timeoutText({ on_timeout: "hibernate", auto_wake: false, hibernated_at: "2024-05-01T12:00:00Z" }),
]));
""",
    )
    assert out[:4] == [
        "kill",
        "kill",
        "hibernate (any request wakes it)",
        "hibernate (wake it to resume)",
    ]
    assert out[4].startswith("hibernate (wake it to resume, hibernated since ") and "2024" in out[4]
