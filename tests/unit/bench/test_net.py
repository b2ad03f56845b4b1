"""The pure parts of ``cryobox bench net``: the clock window math, the server-log parse, the JSON shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from cryobox.bench.net_result import (
    NOTES,
    ClockSample,
    Samples,
    age_key,
    build_result,
    clock_sample,
    parse_ages,
    parse_clock_step_ms,
    result_table,
    window_offset_ns,
)
from cryobox.bench.snapshot_report import BenchError

STATS_KEYS = {"p50", "p90", "p99", "max", "n"}


def test_window_offset_inside_is_zero() -> None:
    assert window_offset_ns(1_000, 1_000, 2_000) == 0
    assert window_offset_ns(1_500, 1_000, 2_000) == 0
    assert window_offset_ns(2_000, 1_000, 2_000) == 0


def test_window_offset_is_the_signed_distance_to_the_window() -> None:
    assert window_offset_ns(400, 1_000, 2_000) == -600  # guest behind
    assert window_offset_ns(2_250, 1_000, 2_000) == 250  # guest ahead


def test_window_offset_refuses_an_inverted_window() -> None:
    with pytest.raises(BenchError, match="empty clock window"):
        window_offset_ns(5, 10, 9)


def test_clock_sample_in_ms() -> None:
    before = 1_700_000_000_000_000_000
    behind = clock_sample(before - 12_500_000, before, before + 3_000_000, age_ms=10_400.0, step_ms=10_380.0)
    assert behind.offset_ms == -12.5
    assert behind.error_ms == 12.5
    assert behind.window_ms == 3.0
    assert (behind.age_ms, behind.step_ms) == (10_400.0, 10_380.0)
    inside = clock_sample(before + 1_000_000, before, before + 3_000_000, age_ms=1.0, step_ms=None)
    assert inside.error_ms == 0.0 and inside.offset_ms == 0.0


def test_parse_ages() -> None:
    assert parse_ages("10,60") == [10.0, 60.0]
    assert parse_ages(" 60, 10 ,10,") == [10.0, 60.0]
    assert parse_ages("2.5") == [2.5]
    for bad in ("", ",", "ten", "0", "-5", "nan"):
        with pytest.raises(BenchError, match="--ages"):
            parse_ages(bad)


def test_age_key() -> None:
    assert age_key(10.0) == "10"
    assert age_key(60) == "60"
    assert age_key(2.5) == "2.5"


LOG = """\
2026-11-30 05:00:01,000 INFO cryobox.agent.sandbox.service: sandbox sb-aaa restored from base in 31 ms (vm vm-1, clock stepped +0.002 s)
2026-11-30 05:00:12,000 INFO cryobox.agent.sandbox.service: sandbox sb-bbb restored from sn-123 in 180 ms (vm vm-2, clock stepped +10.412 s)
2026-11-30 05:00:13,000 INFO cryobox.agent.sandbox.service: sandbox sb-bbbb restored from sn-123 in 180 ms (vm vm-3, clock stepped -0.250 s)
"""  # noqa: E501


def test_parse_clock_step_ms() -> None:
    assert parse_clock_step_ms(LOG, "sb-bbb") == pytest.approx(10_412.0)
    assert parse_clock_step_ms(LOG, "sb-bbbb") == pytest.approx(-250.0)
    assert parse_clock_step_ms(LOG, "sb-aaa") == pytest.approx(2.0)
    assert parse_clock_step_ms(LOG, "sb-ccc") is None
    assert parse_clock_step_ms("", "sb-aaa") is None


def _samples() -> Samples:
    s = Samples(slot_cidr="10.201.0.0/16")
    s.acquire_warm_us = [3.1, 2.0, 2.2, 2.5, 1.9, 2.1, 2.0, 2.3]
    s.acquire_cold_ms = [31.0, 28.0, 29.5, 30.0, 27.0, 33.0, 29.0, 30.5]
    s.destroy_ms = [9.0] * 8
    s.release_warm_ms = [4.0] * 8
    s.snapshot_call_ms = 1234.56
    s.snapshot_capture_offset_ms = 210.04
    s.load_avg = {"start": [0.5, 0.4, 0.3], "end": [1.5, 0.8, 0.4]}
    s.clock = {
        "10": [ClockSample(10_300.0, 0.0, 2.5, 10_290.0), ClockSample(12_000.0, -1.5, 3.0, 11_990.0)],
        "60": [ClockSample(60_200.0, 0.0, 2.0, None), ClockSample(61_900.0, 0.0, 2.2, None)],
    }
    s.clock_second = {
        "10": [ClockSample(10_300.0, 0.0, 40.0, 10_290.0), ClockSample(12_000.0, -3.0, 50.0, 11_990.0)],
        "60": [ClockSample(60_200.0, 2.0, 45.0, None), ClockSample(61_900.0, 0.0, 55.0, None)],
    }
    s.create_call = [90.0, 95.0, 100.0]
    s.create_first_exec = [140.0, 150.0, 160.0]
    s.first_exec_after_create = [50.0, 55.0, 60.0]
    s.boot = [30.0, 31.0, 29.0]
    return s


def _result(ages: tuple[float, ...] = (10.0, 60.0)) -> dict[str, Any]:
    return build_result(
        _samples(),
        n=2,
        ages=list(ages),
        cores=2,
        accelerator="tcg",
        qemu="QEMU emulator version 8.2.2",
        server_version="0.1.0",
        measured_at="2026-11-30T05:00:00Z",
    )


def test_build_result_shape() -> None:
    result = _result()
    assert result["machine"] == {"cores": 2, "accelerator": "tcg"}
    assert result["ages_s"] == [10.0, 60.0]
    for key in (
        "slot_acquire_warm_us",
        "slot_acquire_cold_ms",
        "slot_destroy_ms",
        "slot_release_warm_ms",
        "create_ms",
        "create_first_exec_ms",
        "first_exec_after_create_ms",
        "boot_ms",
    ):
        assert set(result[key]) == STATS_KEYS, key
    assert result["slot_acquire_warm_us"]["n"] == 8
    assert result["slot_acquire_cold_ms"]["p50"] == 29.5
    for key in (
        "clock_error_ms",
        "clock_window_ms",
        "clock_error_without_step_ms",
        "clock_error_second_read_ms",
        "clock_window_second_read_ms",
    ):
        assert list(result[key]) == ["10", "60"], key
        assert all(set(st) == STATS_KEYS for st in result[key].values())
    assert result["clock_error_ms"]["10"]["max"] == 1.5  # the absolute distance, not the signed offset
    assert result["clock_error_ms"]["60"]["max"] == 0.0
    assert result["clock_error_without_step_ms"]["10"]["p50"] == 10_300.0
    assert result["clock_error_second_read_ms"]["60"]["max"] == 2.0
    assert result["clock_window_second_read_ms"]["10"]["p50"] == 40.0
    assert result["clock_step_ms"]["10"]["p50"] == 10_290.0
    assert result["clock_step_ms"]["60"] is None  # no log line found
    assert result["samples"]["clock"]["10"][1] == {
        "age_ms": 12_000.0,
        "offset_ms": -1.5,
        "window_ms": 3.0,
        "step_ms": 11_990.0,
        "second_offset_ms": -3.0,
        "second_window_ms": 50.0,
    }
    assert result["clock_second_read_behind"] == {"10": 1, "60": 0}
    assert result["clock_error_second_read_ms"]["10"]["max"] == 3.0
    assert result["snapshot_call_ms"] == 1234.6
    assert result["snapshot_capture_offset_ms"] == 210.0
    assert result["leftovers"] == []
    assert result["load_avg"] == {"start": [0.5, 0.4, 0.3], "end": [1.5, 0.8, 0.4]}
    assert result["notes"] == NOTES
    assert "plain restore" in result["notes"]["clock_error_without_step_ms"]
    assert json.loads(json.dumps(result)) == result


def test_build_result_needs_every_age() -> None:
    with pytest.raises(BenchError, match="ages"):
        _result((10.0, 30.0))


def test_result_table_renders() -> None:
    result = _result()
    console = Console(record=True, width=100)
    console.print(result_table(result))
    text = console.export_text()
    assert "slot acquire warm µs" in text
    assert "clock error ms, 10 s old" in text and "clock error ms, 60 s old" in text
    assert "create → first exec ms" in text
    assert "2nd read: window ms" in text
