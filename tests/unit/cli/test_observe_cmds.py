"""CLI: ``cryobox sandbox metrics`` and ``cryobox sandbox logs``, in-process through the real SDK against a fake
API (requests and output checked end to end)."""

from __future__ import annotations

import time
from typing import Any

from tests.support.cli import FakeApi, api, expect_json, ok, run
from tests.support.sdk import INFO

__all__ = ["api"]  # the fixture, bound here

SBX = "/v1/sandboxes/sbx_0123"
MIB = 1 << 20
SERIES: dict[str, Any] = {
    "sandbox_id": "sbx_0123",
    "interval_seconds": 5.0,
    "samples": [
        {
            "timestamp": 1714564800.25,
            "cpu_count": 1,
            "cpu_pct": 12.5,
            "memory_bytes": 300 * MIB,
            "mem_total": 512 * MIB,
            "mem_used": 120 * MIB,
            "mem_cache": 30 * MIB,
            "disk_total": 1024 * MIB,
            "disk_used": 256 * MIB,
            "guest_view": True,
        },
        {
            "timestamp": 1714564805.25,
            "cpu_count": 1,
            "cpu_pct": 3.0,
            "memory_bytes": 301 * MIB,
            "mem_total": 512 * MIB,
            "mem_used": 301 * MIB,
            "mem_cache": 0,
            "disk_total": 0,
            "disk_used": 0,
            "guest_view": False,
        },
    ],
    "dropped": 0,
}
PAGE: dict[str, Any] = {
    "sandbox_id": "sbx_0123",
    "logs": [
        {"offset": 4, "timestamp": 1714564800.0, "level": "info", "source": "agent", "message": "resumed"},
        {"offset": 5, "timestamp": 1714564801.5, "level": "warn", "source": "console", "message": "[red]x[/red]"},
    ],
    "next_offset": 6,
    "dropped": 4,
}


def test_metrics_prints_a_table(api: FakeApi) -> None:
    api.on("GET", SBX, ok(200, INFO))
    api.on("GET", f"{SBX}/metrics", ok(200, SERIES))
    result = run("sandbox", "metrics", "sbx_0123")
    assert result.exit_code == 0, result.stderr
    rows = [line.replace("│", " ").split() for line in result.stdout.splitlines() if "2024-05-01" in line]
    assert rows == [
        ["2024-05-01", "12:00:00.250Z", "12.5", "300", "120/512", "30", "256/1024"],
        ["2024-05-01", "12:00:05.250Z", "3.0", "301", "301/512", "(host)", "0", "-"],
    ]
    assert dict(api.requests[-1].url.params) == {}


def test_metrics_since_and_json(api: FakeApi) -> None:
    api.on("GET", SBX, ok(200, INFO))
    api.on("GET", f"{SBX}/metrics", ok(200, SERIES))
    before = time.time()
    assert expect_json(run("sandbox", "metrics", "sbx_0123", "--since", "60", "--json")) == SERIES
    start = float(api.requests[-1].url.params["start"])
    assert before - 61 < start < time.time() - 59
    api.on("GET", f"{SBX}/metrics", ok(200, {**SERIES, "samples": []}))
    empty = run("sandbox", "metrics", "sbx_0123")
    assert empty.exit_code == 0 and "no samples (it is sampled every 5 s while it runs)" in empty.stderr


def test_logs_prints_a_page_and_where_to_go_on(api: FakeApi) -> None:
    api.on("GET", SBX, ok(200, INFO))
    api.on("GET", f"{SBX}/logs", ok(200, PAGE))
    result = run("sandbox", "logs", "sbx_0123", "--offset", "4", "-n", "2", "--level", "info", "--search", "e")
    assert result.exit_code == 0, result.stderr
    rows = [line.replace("│", " ").split() for line in result.stdout.splitlines() if "2024-05-01" in line]
    assert rows == [
        ["4", "2024-05-01", "12:00:00.000Z", "info", "agent", "resumed"],
        ["5", "2024-05-01", "12:00:01.500Z", "warn", "console", "[red]x[/red]"],  # the guest's text, not markup
    ]
    assert "next: --offset 6 (4 older entries no longer kept)" in result.stderr
    params = dict(api.requests[-1].url.params)
    assert params == {"offset": "4", "limit": "2", "direction": "forward", "level": "info", "search": "e"}
    assert expect_json(run("sandbox", "logs", "sbx_0123", "--backward", "--json")) == PAGE
    assert dict(api.requests[-1].url.params) == {"limit": "100", "direction": "backward"}
    calls = len(api.requests)
    assert run("sandbox", "logs", "sbx_0123", "--level", "loud").exit_code == 2
    assert len(api.requests) == calls
