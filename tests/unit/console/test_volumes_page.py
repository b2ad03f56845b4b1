"""The volumes page's pure parts under Node: the create form's size in MiB (a unit times an amount, whole MiB
only) and the URL of a volume (its name encoded). The page itself in a real browser:
``tests/integration/console/test_browser_volumes.py``."""

from __future__ import annotations

from pathlib import Path

from tests.support.nodejs import run_module


def test_sizes_and_paths(tmp_path: Path) -> None:
    out = run_module(
        tmp_path,
        """
import { sizeMb, volPath } from "./pages/volumes.js";
const sizes = [["64", "MiB"], ["2", "GiB"], ["0.5", "GiB"], ["1.5", "MiB"], ["", "MiB"], ["-3", "MiB"], ["4", "TB"]]
  .map(([amount, unit]) => { const v = sizeMb(amount, unit); return v instanceof Error ? v.message : v; });
console.log(JSON.stringify({ sizes, path: volPath("a/../b c") }));
""",
    )
    assert out["sizes"] == [
        64,
        2048,
        512,
        '"1.5 MiB" is not a whole number of MiB',
        '" MiB" is not a whole number of MiB',
        '"-3 MiB" is not a whole number of MiB',
        '"4 TB" is not a whole number of MiB',
    ]
    assert out["path"] == "/v1/volumes/a%2F..%2Fb%20c"
