"""``cryobox bench code``'s result from samples: the side-by-side figures and the speedups."""

from __future__ import annotations

from cryobox.bench.code import build_result


def test_build_result_computes_the_speedups() -> None:
    samples = {
        "first_wall": [100.0, 120.0, 110.0],
        "first_server": [60.0, 70.0, 65.0],
        "frame_wall": [200.0, 210.0, 220.0],
        "frame_server": [150.0, 160.0, 170.0],
        "pandas_wall": [2800.0, 2900.0, 3000.0],
        "pandas_server": [2700.0, 2800.0, 2900.0],
        "steady_wall": [30.0] * 30,
        "steady_server": [20.0] * 30,
    }
    result = build_result(samples, n=3, qemu="7.2.0")
    assert result["first_run_code_ms"]["client"]["p50"] == 110.0
    assert result["first_run_code_ms"]["server"]["p50"] == 65.0
    assert result["import_pandas_ms"]["client"]["p50"] == 2900.0
    assert result["speedup_first_run_code"] == round(2900 / 110, 1)
    assert result["speedup_first_dataframe"] == round(2900 / 210, 1)
    assert result["steady_run_code_ms"]["client"]["p99"] == 30.0 and result["qemu"] == "7.2.0"
