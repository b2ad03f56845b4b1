"""A stop's (or start's) steps, each counted from its beginning, in one log line that ``bench restart`` reads back."""

from __future__ import annotations

from pathlib import Path

from cryobox.bench.restart.standbys import logged_steps
from cryobox.util.steps import StepTimes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_count_from_the_stop_and_read_back(tmp_path: Path) -> None:
    clock = Clock()
    times = StepTimes("stop", clock)
    assert times.describe() == ""
    times.begin()
    clock.now += 0.012
    times.mark("drained")
    times.begin()  # a second signal does not move the origin
    clock.now += 0.2
    times.mark("lock released")
    line = times.describe()
    assert line == "stop: drained +0.012 s, lock released +0.212 s"
    log = tmp_path / "serve.log"
    log.write_text("stop: old +9.000 s\nstopped (keep: 3 sandbox(es) left running)\n")
    offset = log.stat().st_size
    with log.open("a") as out:
        out.write(f"noise\n{line}\n")
    assert logged_steps(log, offset) == {"drained": 0.012, "lock released": 0.212}
    assert logged_steps(log, offset, "start") == {}
    assert logged_steps(log, log.stat().st_size) == {}
    assert logged_steps(tmp_path / "absent.log", 0) == {}


def test_a_mark_without_a_begin_counts_from_itself() -> None:
    clock = Clock()
    times = StepTimes("stop", clock)
    times.mark("drained")
    clock.now += 0.5
    times.mark("app closed")
    assert times.marks == [("drained", 0.0), ("app closed", 0.5)]
