from __future__ import annotations

from cryobox.bench.resume import build_result


def test_build_result_puts_resume_next_to_a_running_sandbox() -> None:
    samples = {"resume": [900.0, 1100.0, 1000.0], "auto": [950.0, 1050.0, 1000.0], "running": [40.0, 50.0, 60.0]}
    result = build_result(samples, n=3, qemu="7.2.0")
    assert result["bench"] == "resume" and result["n"] == 3
    assert result["resume_then_command_ms"]["p50"] == 1000.0 and result["resume_then_command_ms"]["max"] == 1100.0
    assert result["auto_wake_command_ms"]["p50"] == 1000.0 and result["running_command_ms"]["p50"] == 50.0
    assert result["resume_over_running_p50"] == 20.0
    assert set(result["notes"]) == {"resume_then_command_ms", "auto_wake_command_ms", "running_command_ms"}
