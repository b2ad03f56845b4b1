"""The console's usage panel (``js/observe.js`` on the sandbox page): the chart's two series from the API's
samples (CPU, and memory used of the guest's total, both 0–100 %), their polylines in the chart's box, the line
under the chart, and the requests it makes. The module runs under Node (what is tested touches no DOM); the page
in a real browser is ``tests/integration/console/test_browser.py``."""

from __future__ import annotations

from pathlib import Path

from tests.support.nodejs import JS, run_module

MIB = 1 << 20


def test_series_polylines_and_the_latest_line(tmp_path: Path) -> None:
    out = run_module(
        tmp_path,
        """
import { usageSeries, polyline, latestText, CHART } from "./observe.js";
const samples = [
  { timestamp: 100, cpu_pct: 0, mem_used: 0, mem_total: 512 * 1048576, memory_bytes: 1, guest_view: true },
  { timestamp: 110, cpu_pct: 50, mem_used: 256 * 1048576, mem_total: 512 * 1048576, memory_bytes: 1, guest_view: true },
  { timestamp: 120, cpu_pct: 250, mem_used: 1, mem_total: 0, memory_bytes: 3 * 1048576, guest_view: false,
    disk_used: 0, disk_total: 0 },
];
const series = usageSeries(samples);
const size = { width: 108, height: 108, pad: 4 };
console.log(JSON.stringify({
  series,
  line: polyline(series.cpu, 100, 120, size),
  chart: CHART,
  latest: latestText(samples[1]),
  host: latestText(samples[2]),
  none: latestText(undefined),
}));
""",
    )
    assert out["series"] == {"cpu": [[100, 0], [110, 50], [120, 100]], "memory": [[100, 0], [110, 50], [120, 0]]}
    assert out["line"] == "4.0,104.0 54.0,54.0 104.0,4.0"  # 0 % at the bottom, 100 % at the top, time across
    assert out["latest"] == "CPU 50.0 % · memory 256.0 MiB of 512.0 MiB · host charges 1 B"
    assert out["host"].startswith("CPU 250.0 % · memory 1 B of 0 B (host's figure)")
    assert out["none"].startswith("no samples yet")


def test_the_sandbox_page_has_the_usage_panel() -> None:
    page = (JS / "pages" / "sandbox.js").read_text()
    assert 'import { ObservePanel } from "../observe.js";' in page
    assert "usage.start();" in page and "usage.stop();" in page and "usage.el" in page
    script = (JS / "observe.js").read_text()
    for testid in ("usage", "usage-chart", "usage-cpu", "usage-mem", "usage-latest", "sandbox-log", "sandbox-log-row"):
        assert f'"{testid}"' in script, testid
    assert "/metrics?start=" in script and "/logs?direction=backward&limit=" in script
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
