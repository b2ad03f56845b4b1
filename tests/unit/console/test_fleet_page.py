"""The console's fleet page (``js/pages/fleet.js``): each agent's row shows its own herd counters from the latest
metrics sample's ``agents`` (as the control plane gathered them), ``–`` for an agent it has none of, and the last
counters marked when the agent did not answer. The module runs under Node (what is tested touches no DOM); the page
in a real browser is ``tests/integration/console/test_browser.py``."""

from __future__ import annotations

from pathlib import Path

from tests.support.nodejs import JS, run_module


def test_agent_counter_cells(tmp_path: Path) -> None:
    out = run_module(
        tmp_path,
        """
import { counterCells } from "./pages/fleet.js";
console.log(JSON.stringify({
  up: counterCells({ up: true, faults: 120, chunk_fetches: 30, cache_hits: 90, store_gets: 33 }),
  silent: counterCells({ up: false, faults: 5, chunk_fetches: 1, cache_hits: 0, store_gets: 2 }),
  none: counterCells(undefined),
}));
""",
    )
    assert out["up"] == ["120", "30", "90", "33"]
    assert out["silent"] == ["5", "1", "0", "2 (no answer)"]
    assert out["none"] == ["–", "–", "–", "–"]


def test_the_agents_table_takes_the_latest_samples_agents() -> None:
    page = (JS / "pages" / "fleet.js").read_text()
    assert "agentsTable(agentList, last ? last.agents : null)" in page
    assert "...counterCells((counters || {})[a.name])" in page
