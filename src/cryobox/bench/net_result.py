"""The pure parts of ``cryobox bench net`` (unit-tested): the clock window math, the server-log parse, the samples
and the JSON result with its notes and table."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from .snapshot_report import BenchError
from .snapshot_result import stats_n

NOTES = {
    "slot_acquire_warm_us": "SlotPool(size=8).acquire() when the pool is warm (wait_warm() first): a deque pop",
    "slot_acquire_cold_ms": "SlotPool(size=0).acquire(): builds the slot inline (netns, veth, tap, nft) on a thread",
    "slot_destroy_ms": "release() of a size-0 pool's slot: destroy_slot on a worker thread (host veth, netns)",
    "slot_release_warm_ms": (
        "release() of a warm pool's slot: recycle it as idle (it holds no grant); the pool's "
        "filler is rebuilding the 8 slots just taken at the same time"
    ),
    "clock_error_ms": (
        "guest CLOCK_REALTIME read by GET /v1/sandboxes/{id}/net right after the create returned, against the "
        "host time.time_ns() just before and after that call: 0 when inside that window, else the distance to it"
    ),
    "clock_window_ms": "width of that window (the GET /net round trip)",
    "clock_step_ms": (
        "how far the platform stepped the guest's clock at hand-out (epoch_ns - guest clock before the step), "
        "from the server log line 'clock stepped +X.XXX s' (ms resolution)"
    ),
    "clock_error_without_step_ms": (
        "the snapshot's age when the create returned: how far behind the guest's clock would be with a plain "
        "restore and no clock step (it is what a plain restore shows: the guest's wall clock resumes where the "
        "snapshot froze it). Age is counted from the moment the guest was stopped for the capture, estimated as "
        "the start of the snapshot call plus the server's prepopulate_ms (snapshot_capture_offset_ms); "
        "clock_step_ms is the same lag measured in the guest, at the moment of the step"
    ),
    "clock_error_second_read_ms": (
        "as clock_error_ms, from a second GET /net made right after the first: the first one runs the guest's "
        "inspect code for the first time in a new QEMU (TCG translates it), which is what makes its window wide"
    ),
    "clock_window_second_read_ms": "width of that second window",
    "clock_second_read_behind": "per age, in how many samples the second read found the guest behind the window",
    "samples.clock": "offset_ms / second_offset_ms are signed: negative = guest clock behind the window, 0 = inside",
    "create_ms": "POST /v1/sandboxes {template: base} wall time, warm pool full (pre-spawn 2) before each create",
    "create_first_exec_ms": "from the start of that create until the first exec 'true' is answered",
    "first_exec_after_create_ms": "the first exec 'true' alone, after the create returned",
    "boot_ms": "the server's own boot_ms of each of those creates",
}
_STEP_RE = r"sandbox {sid} restored from \S+ in [0-9.]+ ms \(vm \S+, clock stepped ([+-]?[0-9.]+) s\)"


# --- pure helpers --------------------------------------------------------------------------------------------------


def parse_ages(text: str) -> list[float]:
    """``"10,60"`` -> ``[10.0, 60.0]``: positive seconds, sorted, no duplicates."""
    ages: set[float] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            age = float(part)
        except ValueError:
            raise BenchError(f"--ages: {part!r} is not a number of seconds") from None
        if not age > 0:
            raise BenchError(f"--ages: {part!r} must be positive")
        ages.add(age)
    if not ages:
        raise BenchError("--ages: no ages given")
    return sorted(ages)


def age_key(age_s: float) -> str:
    """The JSON key of an age: ``10.0`` -> ``"10"``, ``2.5`` -> ``"2.5"``."""
    return f"{age_s:g}"


def window_offset_ns(guest_ns: int, before_ns: int, after_ns: int) -> int:
    """Signed distance of ``guest_ns`` to the window ``[before_ns, after_ns]``: 0 inside, negative when the guest
    is behind (before the window), positive when it is ahead."""
    if after_ns < before_ns:
        raise BenchError(f"empty clock window [{before_ns}, {after_ns}]")
    if guest_ns < before_ns:
        return guest_ns - before_ns
    if guest_ns > after_ns:
        return guest_ns - after_ns
    return 0


@dataclass(frozen=True)
class ClockSample:
    """One create from a snapshot: the guest clock against the host window, and the snapshot's age."""

    age_ms: float  # the snapshot's age when the create returned
    offset_ms: float  # signed, see window_offset_ns
    window_ms: float
    step_ms: float | None  # from the server log; None if the line was not found

    @property
    def error_ms(self) -> float:
        return abs(self.offset_ms)


def clock_sample(guest_ns: int, before_ns: int, after_ns: int, age_ms: float, step_ms: float | None) -> ClockSample:
    return ClockSample(
        age_ms=age_ms,
        offset_ms=window_offset_ns(guest_ns, before_ns, after_ns) / 1e6,
        window_ms=(after_ns - before_ns) / 1e6,
        step_ms=step_ms,
    )


def parse_clock_step_ms(log_text: str, sandbox_id: str) -> float | None:
    """The clock step the server logged for ``sandbox_id`` (``... clock stepped +12.345 s)``), in ms."""
    match = re.search(_STEP_RE.format(sid=re.escape(sandbox_id)), log_text)
    return None if match is None else float(match.group(1)) * 1000


# --- the measurements ----------------------------------------------------------------------------------------------


@dataclass
class Samples:
    """Raw measurements of one run (what :func:`build_result` summarises)."""

    slot_cidr: str = ""
    acquire_warm_us: list[float] = field(default_factory=list)
    acquire_cold_ms: list[float] = field(default_factory=list)
    destroy_ms: list[float] = field(default_factory=list)
    release_warm_ms: list[float] = field(default_factory=list)
    snapshot_call_ms: float = 0.0
    snapshot_capture_offset_ms: float = 0.0  # from the start of the snapshot call to the guest's stop
    clock: dict[str, list[ClockSample]] = field(default_factory=dict)
    clock_second: dict[str, list[ClockSample]] = field(default_factory=dict)  # a second GET /net right after
    create_call: list[float] = field(default_factory=list)
    create_first_exec: list[float] = field(default_factory=list)
    first_exec_after_create: list[float] = field(default_factory=list)
    boot: list[float] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # network objects a server left behind (cleaned up)
    load_avg: dict[str, list[float]] = field(default_factory=dict)  # host 1/5/15-min load at start and end


def _clock_row(c: ClockSample, seconds: list[ClockSample], i: int) -> dict[str, float | None]:
    row: dict[str, float | None] = {
        "age_ms": round(c.age_ms, 1),
        "offset_ms": round(c.offset_ms, 3),
        "window_ms": round(c.window_ms, 3),
        "step_ms": None if c.step_ms is None else round(c.step_ms, 1),
    }
    if i < len(seconds):
        row["second_offset_ms"] = round(seconds[i].offset_ms, 3)
        row["second_window_ms"] = round(seconds[i].window_ms, 3)
    return row


def _per_age(clock: dict[str, list[ClockSample]], value: str) -> dict[str, dict[str, float]]:
    return {age: stats_n([float(getattr(c, value)) for c in samples]) for age, samples in clock.items()}


def build_result(
    s: Samples,
    *,
    n: int,
    ages: list[float],
    cores: int,
    accelerator: str,
    qemu: str,
    server_version: str,
    measured_at: str,
) -> dict[str, Any]:
    keys = [age_key(a) for a in ages]
    missing = [k for k in keys if not s.clock.get(k)]
    if missing:
        raise BenchError(f"no clock samples for ages {missing}")
    steps = {k: [c.step_ms for c in s.clock[k] if c.step_ms is not None] for k in keys}
    return {
        "n": n,
        "ages_s": [float(a) for a in ages],
        "machine": {"cores": cores, "accelerator": accelerator},
        "qemu": qemu,
        "server_version": server_version,
        "slot_cidr": s.slot_cidr,
        "slot_acquire_warm_us": stats_n(s.acquire_warm_us),
        "slot_acquire_cold_ms": stats_n(s.acquire_cold_ms),
        "slot_destroy_ms": stats_n(s.destroy_ms),
        "slot_release_warm_ms": stats_n(s.release_warm_ms),
        "snapshot_call_ms": round(s.snapshot_call_ms, 1),
        "snapshot_capture_offset_ms": round(s.snapshot_capture_offset_ms, 1),
        "clock_error_ms": _per_age(s.clock, "error_ms"),
        "clock_window_ms": _per_age(s.clock, "window_ms"),
        "clock_step_ms": {k: stats_n(v) if v else None for k, v in steps.items()},
        "clock_error_without_step_ms": _per_age(s.clock, "age_ms"),
        "clock_error_second_read_ms": _per_age(s.clock_second, "error_ms"),
        "clock_window_second_read_ms": _per_age(s.clock_second, "window_ms"),
        "clock_second_read_behind": {k: sum(c.offset_ms < 0 for c in v) for k, v in s.clock_second.items()},
        "create_ms": stats_n(s.create_call),
        "create_first_exec_ms": stats_n(s.create_first_exec),
        "first_exec_after_create_ms": stats_n(s.first_exec_after_create),
        "boot_ms": stats_n(s.boot),
        "samples": {
            "slot_acquire_warm_us": [round(v, 2) for v in s.acquire_warm_us],
            "slot_acquire_cold_ms": [round(v, 2) for v in s.acquire_cold_ms],
            "clock": {k: [_clock_row(c, s.clock_second.get(k, []), i) for i, c in enumerate(s.clock[k])] for k in keys},
            "create_ms": [round(v, 1) for v in s.create_call],
            "create_first_exec_ms": [round(v, 1) for v in s.create_first_exec],
        },
        "load_avg": dict(s.load_avg),
        "leftovers": list(s.leftovers),
        "notes": dict(NOTES),
        "measured_at": measured_at,
    }


def _fmt(value: float) -> str:
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def result_table(result: dict[str, Any]) -> Table:
    machine = result["machine"]
    table = Table(title=f"cryobox bench net ({machine['accelerator']}, {machine['cores']} cores, n={result['n']})")
    for col in ("metric", "p50", "p90", "max", "n"):
        table.add_column(col, justify="left" if col == "metric" else "right")

    def row(label: str, st: dict[str, float] | None) -> None:
        if st is None:
            table.add_row(label, "-", "-", "-", "0")
        else:
            table.add_row(label, _fmt(st["p50"]), _fmt(st["p90"]), _fmt(st["max"]), str(int(st["n"])))

    row("slot acquire warm µs", result["slot_acquire_warm_us"])
    row("slot acquire cold ms", result["slot_acquire_cold_ms"])
    row("slot destroy ms", result["slot_destroy_ms"])
    row("slot release warm ms", result["slot_release_warm_ms"])
    for age in result["clock_error_ms"]:
        row(f"clock error ms, {age} s old", result["clock_error_ms"][age])
        row("  GET /net window ms", result["clock_window_ms"][age])
        row("  clock step ms", result["clock_step_ms"][age])
        row("  without step ms", result["clock_error_without_step_ms"][age])
        if age in result["clock_error_second_read_ms"]:
            row("  2nd read: error ms", result["clock_error_second_read_ms"][age])
            row("  2nd read: window ms", result["clock_window_second_read_ms"][age])
    row("create ms (warm pool)", result["create_ms"])
    row("create → first exec ms", result["create_first_exec_ms"])
    row("  first exec alone ms", result["first_exec_after_create_ms"])
    row("  server boot_ms", result["boot_ms"])
    load = result.get("load_avg") or {}
    if load:
        table.caption = "host load avg (1/5/15 min): " + ", ".join(
            f"{when} {'/'.join(f'{x:.1f}' for x in values)}" for when, values in load.items()
        )
    return table
