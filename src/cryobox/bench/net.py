"""``cryobox bench net``: what networking adds to a create, and how right a restored guest's clock is.

1. Slot acquire, pool warm vs cold, with :mod:`cryobox.agent.net` directly (no server): a :class:`SlotPool` of 8
   pre-built slots hands out 8 (a deque pop each); a pool of size 0 builds each of 8 inline (netns, veth, tap,
   nft). Releasing the cold pool's slots destroys them (``slot_destroy_ms``); releasing the warm pool's clears
   their egress and recycles them (``slot_release_warm_ms``). The slots use a random tag and a free
   ``10.N.0.0/16``; no traffic is sent. Everything carrying the tag is removed at the end, and checked gone.
2. Clock error at the moment create returns, against a real ``cryobox serve`` (pre-spawn 1): a ``base`` sandbox is
   snapshotted; once the snapshot is ``age`` seconds old, ``n`` sandboxes are created from it one after the
   other, and right after each create returns ``GET /v1/sandboxes/{id}/net`` reads the guest's wall clock. The
   host's ``time.time_ns()`` just before and after that call bound the window the guest's clock must fall in.
   A second ``GET /net`` right after gives the same with a narrower window (the first one is slowed by TCG
   translating the guest's inspect code in the new QEMU). The clock step the server applied is read from its log.
3. Create latency with networking and the full resume sequence: creates of ``base`` from the warm pool
   (pre-spawn 2), each started once the pool is full again, to the first ``exec true`` answered.

Everything goes through the HTTP API with plain ``httpx``; everything created is deleted in ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..config import DEFAULT_CACHE_DIR, Paths
from ..util.progress import Reporter
from .report import write_result
from .server import ServeProcess
from .snapshot import capture_breakdown, qemu_version
from .snapshot_api import Api, api_session
from .snapshot_report import BenchError
from .snapshot_result import stats_n

SLOT_N = 8  # acquires timed per pool kind
SLOT_POOL_SIZE = 8
CREATES = 10
CLOCK_PRESPAWN = 1
CREATE_PRESPAWN = 2
DEFAULT_AGES = "10,60"
POOL_WAIT_S = 600.0
NOTES = {
    "slot_acquire_warm_us": "SlotPool(size=8).acquire() when the pool is warm (wait_warm() first): a deque pop",
    "slot_acquire_cold_ms": "SlotPool(size=0).acquire(): builds the slot inline (netns, veth, tap, nft) on a thread",
    "slot_destroy_ms": "release() of a size-0 pool's slot: destroy_slot on a worker thread (host veth, netns)",
    "slot_release_warm_ms": (
        "release() of a warm pool's slot: clear its egress grants (nft) and recycle it as idle; the pool's "
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


def _us_since(started_ns: int) -> float:
    return (time.perf_counter_ns() - started_ns) / 1e3


async def measure_slots(s: Samples, console: Console, progress: Reporter) -> None:
    """Part 1: warm vs cold slot acquires on a pool of our own (random tag, free CIDR); leaves nothing behind."""
    from ..agent.net import Firewall, SlotPlan, SlotPool
    from ..agent.net.netlink import host_networks, list_tagged, reclaim
    from ..agent.net.slots import pick_cidr

    tag = secrets.token_hex(3)
    plan = SlotPlan(tag=tag, cidr=pick_cidr(await asyncio.to_thread(host_networks)))
    s.slot_cidr = plan.cidr
    console.print(f"network slots: tag {tag}, CIDR {plan.cidr}")
    firewall = Firewall(plan)
    try:
        await asyncio.to_thread(firewall.ensure, fresh=True)
        warm = SlotPool(plan, size=SLOT_POOL_SIZE, egress=firewall)
        try:
            await warm.wait_warm(timeout=300)
            slots = []
            with progress.phase("warm slots: acquire, release", 2 * SLOT_N) as phase:
                for _ in range(SLOT_N):
                    started = time.perf_counter_ns()
                    slots.append(await warm.acquire())
                    s.acquire_warm_us.append(_us_since(started))
                    phase.advance()
                for slot in slots:
                    started = time.perf_counter_ns()
                    await warm.release(slot)
                    s.release_warm_ms.append(_us_since(started) / 1e3)
                    phase.advance()
            st = warm.stats()
            if (st.warm_acquires, st.cold_acquires) != (SLOT_N, 0):
                raise BenchError(f"warm pool: {st.warm_acquires} warm and {st.cold_acquires} cold acquires")
        finally:
            await warm.close()
        console.print(f"  warm acquire p50 {stats_n(s.acquire_warm_us)['p50']} µs")

        cold = SlotPool(plan, size=0, egress=firewall)
        try:
            slots = []
            with progress.phase("cold slots: acquire, destroy", 2 * SLOT_N) as phase:
                for _ in range(SLOT_N):
                    started = time.perf_counter_ns()
                    slots.append(await cold.acquire())
                    s.acquire_cold_ms.append(_us_since(started) / 1e3)
                    phase.advance()
                for slot in slots:
                    started = time.perf_counter_ns()
                    await cold.release(slot)  # size 0: nothing may stay idle, so this destroys the slot
                    s.destroy_ms.append(_us_since(started) / 1e3)
                    phase.advance()
            st = cold.stats()
            if (st.warm_acquires, st.cold_acquires, st.destroyed) != (0, SLOT_N, SLOT_N):
                raise BenchError(
                    f"cold pool: {st.warm_acquires} warm, {st.cold_acquires} cold acquires, {st.destroyed} destroyed"
                )
        finally:
            await cold.close()
        console.print(
            f"  cold acquire p50 {stats_n(s.acquire_cold_ms)['p50']} ms, destroy p50 {stats_n(s.destroy_ms)['p50']} ms"
        )
    finally:
        try:
            await asyncio.to_thread(firewall.remove)
        finally:
            await asyncio.to_thread(reclaim, tag)
    left = await asyncio.to_thread(list_tagged, tag)
    if left.netns or left.links:
        raise BenchError(f"network objects tagged {tag} left behind: netns {left.netns}, links {left.links}")
    if await asyncio.to_thread(firewall.exists):
        raise BenchError(f"nft table {firewall.table} left behind")


def check_server_net(data_dir: Path) -> list[str]:
    """After a server stopped: what it left carrying its tag (netns, links, its nft table), removed now."""
    from ..agent.net import Firewall, SlotPlan
    from ..agent.net.netlink import list_tagged, reclaim
    from ..agent.net.slots import tag_for

    tag = tag_for(data_dir.resolve())
    left = list_tagged(tag)
    firewall = Firewall(SlotPlan(tag=tag))
    found = [*left.netns, *left.links] + ([f"nft table {firewall.table}"] if firewall.exists() else [])
    if found:
        reclaim(tag)
        firewall.remove()
    return found


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _capture_offset_ms(paths: Paths, snapshot_id: str) -> float:
    """How long after the snapshot call started the guest was stopped for the capture: the server's
    ``prepopulate_ms`` (RAM pre-populated while the guest runs; ``stop`` comes right after)."""
    manifest = paths.snapshots_dir / snapshot_id / "manifest.json"
    try:
        capture = capture_breakdown(json.loads(manifest.read_text()))
    except (OSError, ValueError) as err:
        raise BenchError(f"cannot read {manifest}: {err}") from err
    return capture.get("prepopulate_ms", 0.0)


def _read_guest_clock(api: Api, sandbox_id: str) -> tuple[int, int, int]:
    """(guest CLOCK_REALTIME, host time.time_ns() just before, just after) of one ``GET /net``."""
    before = time.time_ns()
    view = api.call("GET", f"/v1/sandboxes/{sandbox_id}/net", 200)
    after = time.time_ns()
    try:
        return int(view["clock"]["realtime_ns"]), before, after
    except (KeyError, TypeError, ValueError) as err:
        raise BenchError(f"GET /net of {sandbox_id} has no clock.realtime_ns: {str(view)[:500]}") from err


def measure_clock(
    api: Api,
    paths: Paths,
    log_path: Path,
    ages: list[float],
    n: int,
    s: Samples,
    console: Console,
    progress: Reporter,
) -> None:
    """Part 2: create from a snapshot once it is ``age`` old, and read the guest clock right after."""
    source = api.create({"template": "base"})
    started = time.monotonic()
    snap = api.snapshot(source["id"])
    s.snapshot_call_ms = (time.monotonic() - started) * 1000
    s.snapshot_capture_offset_ms = _capture_offset_ms(paths, snap["id"])
    frozen = started + s.snapshot_capture_offset_ms / 1000  # the guest's clock froze here
    for age in ages:
        wait = age - (time.monotonic() - frozen)
        if wait > 0:
            console.print(f"clock: waiting {wait:.0f} s until snapshot {snap['id']} is {age_key(age)} s old")
            time.sleep(wait)
        samples = s.clock.setdefault(age_key(age), [])
        seconds = s.clock_second.setdefault(age_key(age), [])
        phase = progress.phase(f"creates from a snapshot {age_key(age)} s old", n)
        for _ in range(n):
            sbx = api.create({"from_snapshot": snap["id"]})
            age_ms = (time.monotonic() - frozen) * 1000
            first = _read_guest_clock(api, sbx["id"])
            second = _read_guest_clock(api, sbx["id"])  # the same, with the guest's inspect path translated
            step = parse_clock_step_ms(_read_log(log_path), sbx["id"])
            samples.append(clock_sample(*first, age_ms, step))
            seconds.append(clock_sample(*second, age_ms, step))
            api.delete_sandbox(sbx["id"])
            phase.advance()
        phase.finish()
        last = samples[-1]
        console.print(
            f"  age {age_key(age)} s: error p50 {stats_n([c.error_ms for c in samples])['p50']} ms "
            f"(window p50 {stats_n([c.window_ms for c in samples])['p50']} ms), last step "
            f"{'?' if last.step_ms is None else f'{last.step_ms:.0f}'} ms at age {last.age_ms:.0f} ms; "
            f"2nd read error p50 {stats_n([c.error_ms for c in seconds])['p50']} ms, "
            f"behind in {sum(c.offset_ms < 0 for c in seconds)}/{len(seconds)}"
        )
    api.delete_sandbox(source["id"])  # takes its snapshot along
    api.snapshots.remove(snap["id"])


def _expected_pool(api: Api, prespawn: int) -> int:
    items = api.call("GET", "/v1/templates", 200)["items"]
    return prespawn * sum(1 for t in items if t.get("status") == "ready")


def _wait_pool_full(api: Api, expected: int, timeout_s: float = POOL_WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        ready = int(api.call("GET", "/v1/info", 200)["capacity"]["prespawned_vms"])
        if ready >= expected:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"warm pool not full after {timeout_s:.0f}s ({ready}/{expected} VMs)")
        time.sleep(0.2)


def measure_creates(api: Api, prespawn: int, creates: int, s: Samples, console: Console, progress: Reporter) -> None:
    """Part 3: creates of ``base`` from a full warm pool, to the first ``exec true`` answered."""
    expected = _expected_pool(api, prespawn)
    phase = progress.phase("creates from the warm pool", creates)
    for _ in range(creates):
        _wait_pool_full(api, expected)
        started = time.monotonic()
        sbx = api.create({"template": "base"})
        created = time.monotonic()
        api.exec(sbx["id"], "true")
        done = time.monotonic()
        s.create_call.append((created - started) * 1000)
        s.create_first_exec.append((done - started) * 1000)
        s.first_exec_after_create.append((done - created) * 1000)
        s.boot.append(float(sbx["boot_ms"]))
        api.delete_sandbox(sbx["id"])
        phase.advance()
    phase.finish()
    console.print(
        f"  create p50 {stats_n(s.create_call)['p50']} ms, to first exec p50 "
        f"{stats_n(s.create_first_exec)['p50']} ms, boot_ms p50 {stats_n(s.boot)['p50']} ms"
    )


# --- the result ----------------------------------------------------------------------------------------------------


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


def run_net_bench(
    *,
    n: int,
    ages: str,
    out_dir: Path,
    cache_dir: Path | None,
    console: Console,
    progress: Reporter,
    creates: int = CREATES,
) -> dict[str, Any]:
    if n < 1 or creates < 1:
        raise BenchError("--n and the number of creates must be at least 1")
    age_list = parse_ages(ages)
    qemu = qemu_version()
    s = Samples()
    s.load_avg["start"] = [round(x, 2) for x in os.getloadavg()]
    info: dict[str, Any] = {}
    console.print(f"slot acquire: {SLOT_N} warm (pool of {SLOT_POOL_SIZE}), {SLOT_N} cold (pool of 0)")
    asyncio.run(measure_slots(s, console, progress))

    with tempfile.TemporaryDirectory(prefix="cryobox-bench-net-") as tmp:
        for prespawn in (CLOCK_PRESPAWN, CREATE_PRESPAWN):
            data_dir = Path(tmp) / f"data-{prespawn}"
            console.print(f"starting cryobox serve (prespawn {prespawn})")
            with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=prespawn) as server:
                with api_session(server.url, server.api_key, console) as api:
                    info = api.call("GET", "/v1/info", 200)
                    if prespawn == CLOCK_PRESPAWN:
                        console.print(f"clock error at create, snapshot ages {[age_key(a) for a in age_list]} s")
                        paths = Paths(data_dir.resolve(), (cache_dir or DEFAULT_CACHE_DIR).resolve())
                        measure_clock(api, paths, server.log_path, age_list, n, s, console, progress)
                    else:
                        console.print(f"create latency, {creates} creates of base from the warm pool")
                        measure_creates(api, prespawn, creates, s, console, progress)
            s.leftovers.extend(check_server_net(data_dir))

    s.load_avg["end"] = [round(x, 2) for x in os.getloadavg()]
    result = build_result(
        s,
        n=n,
        ages=age_list,
        cores=os.cpu_count() or 0,
        accelerator=str(info["accelerator"]),
        qemu=qemu,
        server_version=str(info["version"]),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    out = write_result(out_dir, "net", result)
    console.print(result_table(result))
    console.print(f"written to {out}")
    if s.leftovers:
        raise BenchError("a server left network objects behind (removed now): " + "; ".join(s.leftovers))
    return result
