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
4. The egress proxy's cost, host-side like part 1 (no VM, no server): connect latency, HTTP by name and bulk
   throughput of a real slot's guest through the proxy against a guest the host kernel routes (:mod:`.egress`).
   ``--only egress`` runs this part alone (its JSON then has only the ``egress_*`` keys and the machine).

Everything goes through the HTTP API with plain ``httpx``; everything created is deleted in ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from ..config import DEFAULT_CACHE_DIR, Paths
from ..util.progress import Reporter
from .egress import measure_egress
from .egress_result import EGRESS_NOTES, EgressSamples, build_egress_result, egress_table
from .net_result import (
    Samples,
    age_key,
    build_result,
    clock_sample,
    parse_ages,
    parse_clock_step_ms,
    result_table,
)
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
SECTIONS = ("egress",)
"""What ``--only`` may name."""


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
        warm = SlotPool(plan, size=SLOT_POOL_SIZE)
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

        cold = SlotPool(plan, size=0)
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


def _egress(console: Console, progress: Reporter) -> dict[str, Any]:
    """Part 4: the egress section's keys for the result (printed as a table of their own)."""
    console.print("egress enforcement vs direct routing: connect, HTTP by name, throughput (no VM)")
    samples = EgressSamples()
    asyncio.run(measure_egress(samples, console, progress))
    part = build_egress_result(samples)
    console.print(egress_table(part))
    return part


def _egress_only(out_dir: Path, console: Console, progress: Reporter) -> dict[str, Any]:
    load_start = [round(x, 2) for x in os.getloadavg()]
    part = _egress(console, progress)
    result = {
        "only": ["egress"],
        "machine": {"cores": os.cpu_count() or 0},
        **part,
        "load_avg": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "notes": dict(EGRESS_NOTES),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    console.print(f"written to {write_result(out_dir, 'net', result)}")
    return result


def run_net_bench(
    *,
    n: int,
    ages: str,
    out_dir: Path,
    cache_dir: Path | None,
    console: Console,
    progress: Reporter,
    creates: int = CREATES,
    only: str | None = None,
) -> dict[str, Any]:
    if n < 1 or creates < 1:
        raise BenchError("--n and the number of creates must be at least 1")
    if only is not None:
        if only not in SECTIONS:
            raise BenchError(f"--only: {only!r} is not one of {', '.join(SECTIONS)}")
        return _egress_only(out_dir, console, progress)
    age_list = parse_ages(ages)
    qemu = qemu_version()
    s = Samples()
    s.load_avg["start"] = [round(x, 2) for x in os.getloadavg()]
    info: dict[str, Any] = {}
    console.print(f"slot acquire: {SLOT_N} warm (pool of {SLOT_POOL_SIZE}), {SLOT_N} cold (pool of 0)")
    asyncio.run(measure_slots(s, console, progress))
    egress = _egress(console, progress)

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
    result = {**result, **egress, "notes": {**result["notes"], **EGRESS_NOTES}}
    out = write_result(out_dir, "net", result)
    console.print(result_table(result))
    console.print(egress_table(result))
    console.print(f"written to {out}")
    if s.leftovers:
        raise BenchError("a server left network objects behind (removed now): " + "; ".join(s.leftovers))
    return result
