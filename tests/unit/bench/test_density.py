"""The pure parts of ``cryobox bench density``: summaries, the slope, the machine, Pss from records and a fake
/proc, refusals, the table and the SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cryobox.bench.density_result import (
    cpu_model,
    is_refusal,
    latency_summary,
    machine,
    pss_level,
    refusal,
    sandbox_pids,
    slope,
    snapshot_summary,
    table,
)
from cryobox.bench.density_svg import nice_max, render

SVG = "{http://www.w3.org/2000/svg}"


def test_latency_summary_nearest_rank_and_mean() -> None:
    samples = [float(i) for i in range(100, 0, -1)]  # 1..100
    s = latency_summary(samples, errors=2)
    assert s == {"n": 100, "errors": 2, "avg": 50.5, "p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}


def test_latency_summary_of_nothing_is_all_none() -> None:
    s = latency_summary([], errors=3)
    assert s["n"] == 0 and s["errors"] == 3 and s["p95"] is None and s["avg"] is None


def test_slope_is_least_squares() -> None:
    k, b = slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)])
    assert (k, b) == pytest.approx((2.0, 1.0))
    k, b = slope([(0.0, 0.0), (0.0, 2.0), (2.0, 2.0), (2.0, 4.0)])  # means per x: 1 and 3
    assert (k, b) == pytest.approx((1.0, 1.0))


def test_slope_needs_two_sizes() -> None:
    with pytest.raises(ValueError, match="two distinct"):
        slope([(16.0, 50.0), (16.0, 60.0)])


def test_snapshot_summary_slope_per_100_mib() -> None:
    # 40 ms + 0.5 ms per MiB: 50 ms per 100 MiB; the first snapshot's one-time cost (283 ms) does not bend it
    s = snapshot_summary({16: [283.0, 48.0, 48.0], 64: [72.0], 128: [104.0, 104.0, 104.0]})
    assert s["ms_per_100_mib"] == 50.0
    assert s["intercept_ms"] == 40.0
    assert [p["dirtied_mib"] for p in s["points"]] == [16, 64, 128]
    assert s["points"][2]["snapshot_ms_p50"] == 104.0


def test_snapshot_summary_of_one_size_has_no_slope() -> None:
    assert snapshot_summary({64: [70.0, 71.0]})["ms_per_100_mib"] is None


def test_machine_from_proc_text() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
    m = machine(
        cpuinfo=cpuinfo,
        meminfo="MemTotal:       24683520 kB\nMemFree:  100 kB\n",
        cores=2,
        accelerator="tcg",
        qemu="QEMU emulator version 7.2.22",
        server_version="0.1.0",
        kernel="6.1.0-test",
    )
    assert m == {
        "accelerator": "tcg",
        "cores": 2,
        "memory_mib": 24105,
        "cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz",
        "kernel": "6.1.0-test",
        "qemu": "QEMU emulator version 7.2.22",
        "server_version": "0.1.0",
    }
    assert cpu_model("processor: 0\n") == "unknown"


def _proc(tmp_path: Path, pss: dict[int, tuple[int, int]]) -> Path:
    proc = tmp_path / "proc"
    for pid, (pss_kib, rss_kib) in pss.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "smaps_rollup").write_text(
            f"55d0-7ffe ---p 00000000 00:00 0 [rollup]\nRss: {rss_kib} kB\nPss: {pss_kib} kB\n"
        )
    return proc


def test_sandbox_pids_from_records_skips_the_unreadable(tmp_path: Path) -> None:
    (tmp_path / "sbx_a.json").write_text(json.dumps({"id": "sbx_a", "vm": {"pid": 41}}))
    (tmp_path / "sbx_b.json").write_text(json.dumps({"id": "sbx_b", "vm": None}))  # hibernated: no VM
    (tmp_path / "sbx_c.json").write_text("{torn")
    assert sandbox_pids(tmp_path, ["sbx_a", "sbx_b", "sbx_c", "sbx_gone"]) == {"sbx_a": 41}


def test_pss_level_sums_qemus_and_shares_the_memory_server(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: (50 * 1024, 80 * 1024), 2: (70 * 1024, 90 * 1024), 9: (20 * 1024, 30 * 1024)})
    level = pss_level(
        2, [1, 2], memserver_pid=9, mem_available_before_kib=1000 * 1024, mem_available_kib=800 * 1024, proc=proc
    )
    assert level["pss_per_sandbox_mib"] == 70.0  # (50 + 70 + 20) / 2
    assert level["qemu_pss_total_mib"] == 120.0
    assert level["qemu_rss_per_sandbox_mib"] == 85.0
    assert level["memserver_pss_mib"] == 20.0
    assert level["host_used_per_sandbox_mib"] == 100.0
    without = pss_level(2, [1, 2], memserver_pid=None, mem_available_before_kib=0, mem_available_kib=0, proc=proc)
    assert without["pss_per_sandbox_mib"] == 60.0 and without["memserver_pss_mib"] is None


def test_pss_level_refuses_a_missing_qemu(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: (1, 1)})
    with pytest.raises(RuntimeError, match="1 QEMU pids for 2"):
        pss_level(2, [1], memserver_pid=None, mem_available_before_kib=0, mem_available_kib=0, proc=proc)
    with pytest.raises(RuntimeError, match="pid 7"):
        pss_level(1, [7], memserver_pid=None, mem_available_before_kib=0, mem_available_kib=0, proc=proc)


def test_refusal_reads_the_wire_code() -> None:
    body = json.dumps({"error": "no host has room", "code": "capacity", "details": {}})
    assert refusal(503, body) == {"status": 503, "code": "capacity", "message": body}
    assert refusal(429, "not json")["code"] is None
    assert is_refusal(503) and is_refusal(429)
    assert not is_refusal(500) and not is_refusal(400)


def _result() -> dict[str, Any]:
    return {
        "template": "base",
        "measured_at": "2026-12-06T06:30:00Z",
        "machine": {
            "accelerator": "tcg",
            "cores": 2,
            "memory_mib": 24105,
            "cpu_model": "Xeon <test> & co",
            "kernel": "6.1",
            "qemu": "7.2",
            "server_version": "0.1.0",
        },
        "create_to_first_exec_ms": {
            str(c): latency_summary([float(i * c) for i in range(1, 101)]) for c in (1, 4, 8, 16)
        },
        "pss": {
            "levels": [
                {"n": n, "pss_per_sandbox_mib": 60.0 - n / 10, "host_used_per_sandbox_mib": 70.0} for n in (10, 25, 45)
            ],
            "not_reached": [50],
        },
        "capacity": {
            "held": 45,
            "cap": 200,
            "refusal": {"status": 503, "code": "capacity", "message": "..."},
            "mem_free_mib": 19000.0,
            "mem_available_mib": 20000.0,
        },
        "snapshot": {"ms_per_100_mib": 50.0, "intercept_ms": 40.0, "points": []},
    }


def test_table_has_a_row_per_figure() -> None:
    console = Console(record=True, width=200)
    console.print(table(_result()))
    text = console.export_text()
    assert "TCG, 2 cores, 24 GiB" in text
    assert "concurrency 16" in text and "p95 1520.0" in text
    assert "N=45" in text and "45 (503 capacity)" in text
    assert "50.0 ms (+40.0 ms)" in text


def test_svg_is_well_formed_with_a_series_per_percentile() -> None:
    root = ET.fromstring(render(_result()))
    assert root.tag == f"{SVG}svg"
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 5  # p50, p95, p99; Pss and the host's MemAvailable fall
    assert all(
        len(line.get("points", "").split()) == points for line, points in zip(lines, (4, 4, 4, 3, 3), strict=True)
    )
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert any("Xeon <test> & co" in t for t in texts)  # escaped in the file, intact once parsed
    # p99 above p95 above p50 at every level: a smaller y is higher on the page
    p50, p95, p99 = ([float(xy.split(",")[1]) for xy in (line.get("points") or "").split()] for line in lines[:3])
    assert all(a > b > c for a, b, c in zip(p50, p95, p99, strict=True))


def test_svg_of_a_result_without_samples_still_renders() -> None:
    result = _result()
    result["create_to_first_exec_ms"] = {"1": latency_summary([])}
    result["pss"]["levels"] = []
    root = ET.fromstring(render(result))
    assert root.tag == f"{SVG}svg"


@pytest.mark.parametrize(
    ("value", "top"),
    [(0, 1.0), (1, 1.0), (3, 4.0), (5, 5.0), (12, 20.0), (480, 500.0), (6271, 8000.0), (9000, 10000.0)],
)
def test_nice_max(value: float, top: float) -> None:
    assert nice_max(value) == top
