"""The host agent's observer of its sandboxes: every ``interval_s`` it samples each running sandbox and follows
each live sandbox's console, keeping a bounded history and log per sandbox (:mod:`.history`, :mod:`.logbook`).

A sample's CPU and memory are read on the host (:mod:`.usage`: the VM's cgroup or QEMU process, which a guest
cannot fake); the guest's own view of its memory and disk comes from file reads through its agent
(:mod:`.guestview`: nothing is started in the guest), and when the guest does not answer in time the sample
carries the last view it gave (or the host's figures). CPU is a difference between two readings, so a sandbox's
first sample comes one interval after it is first seen running.

Observing is not activity: nothing here touches a sandbox's idle clock, holds it busy, wakes it or takes its
lock (while a lifecycle change or a capture holds the lock, the guest is not asked, so no request of the
observer's is in flight in a snapshot). Paused and hibernated sandboxes are not sampled (their history stays);
what the service no longer holds is forgotten at the next tick. The agent's own lines about a sandbox come from
the service's record writes (:mod:`.journal`, registered with :meth:`~..sandbox.service.SandboxService.watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...agentapi.models_obs import LogPage, LogQuery, MetricSeries
from ...errors import InvalidArgument
from ...util.procfs import PROC
from ..sandbox.sandbox import Sandbox, SandboxState
from ..sandbox.service import SandboxService
from .console import ConsoleCursor, ConsoleRead, read_new
from .guestview import GuestDisk, GuestMemory, read_device_bytes, read_disk, read_memory
from .history import Sample, SampleHistory, prometheus_text
from .journal import Journal
from .logbook import LogBook
from .rings import RingBounds
from .usage import HostUsage, VmProbe, cpu_percent, read_usage

log = logging.getLogger(__name__)
INTERVAL_ENV = "CRYOBOX_SANDBOX_SAMPLE_INTERVAL_S"
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.2, 3600.0
MIB = 1 << 20


@dataclass(frozen=True)
class ObserveConfig:
    interval_s: float = 5.0
    samples_per_sandbox: int = 720
    """An hour at the default interval."""
    samples_total: int = 100_000
    log_lines_per_sandbox: int = 4000
    log_bytes_per_sandbox: int = 256 << 10
    log_bytes_total: int = 32 << 20
    console_bytes_per_tick: int = 64 << 10
    """What one tick reads of a sandbox's console at most; a guest writing more has the rest skipped."""
    guest_timeout_s: float = 2.0
    memory_every_s: float = 5.0
    """How often the guest's own memory figures are read (at most once a tick; the host's are read every tick)."""
    disk_every_s: float = 30.0
    """How often the guest's disk use is read."""
    concurrency: int = 8
    """Guests asked at once."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ObserveConfig:
        """The defaults, with ``CRYOBOX_SANDBOX_SAMPLE_INTERVAL_S`` (seconds, 0.2-3600) when set."""
        raw = (os.environ if env is None else env).get(INTERVAL_ENV, "").strip()
        if not raw:
            return cls()
        try:
            interval = float(raw)
        except ValueError:
            raise InvalidArgument(f"{INTERVAL_ENV} must be a number of seconds, not {raw!r}") from None
        if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
            raise InvalidArgument(f"{INTERVAL_ENV} must be {MIN_INTERVAL_S}-{MAX_INTERVAL_S:.0f} s, not {raw!r}")
        return cls(interval_s=interval)


@dataclass
class Watch:
    """What the observer keeps of one sandbox's current VM between ticks."""

    vm_id: str
    console: ConsoleCursor
    usage: HostUsage | None = None
    usage_at: float = 0.0
    memory: GuestMemory | None = None
    memory_at: float = float("-inf")
    memory_asked: float = float("-inf")
    device_bytes: int | None = None
    disk: GuestDisk | None = None
    disk_at: float = float("-inf")


@dataclass
class _HostRead:
    usage: HostUsage | None
    console: ConsoleRead = field(default_factory=ConsoleRead)


class SandboxObserver:
    def __init__(
        self,
        service: SandboxService,
        config: ObserveConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        proc: Path = PROC,
    ) -> None:
        self.service = service
        self.config = config or ObserveConfig()
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.proc = proc
        cfg = self.config
        self.history = SampleHistory(cfg.samples_per_sandbox, cfg.samples_total, cfg.interval_s)
        self.logs = LogBook(RingBounds(cfg.log_lines_per_sandbox, cfg.log_bytes_per_sandbox, cfg.log_bytes_total))
        self.journal = Journal(self.logs, clock)
        self._watches: dict[str, Watch] = {}
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0
        for sandbox in service.held():  # adopted before the observer existed
            self.journal.changed(sandbox)
        service.watch(self.journal.changed)

    # -- reads ---------------------------------------------------------------------------------------------

    def series(self, sandbox_id: str, start: float | None = None, end: float | None = None) -> MetricSeries:
        return self.history.series(sandbox_id, start, end)

    def page(self, sandbox_id: str, query: LogQuery) -> LogPage:
        return self.logs.page(sandbox_id, query)

    async def metrics_text(self) -> str:
        return prometheus_text(self.history)

    # -- the loop ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sandbox-observer")

    async def _run(self) -> None:
        while True:
            started = self.monotonic()
            try:
                await self.tick()
            except Exception as err:  # one bad tick never stops observing
                log.warning("observing sandboxes failed: %s", err)
            await self.sleep(max(0.0, self.config.interval_s - (self.monotonic() - started)))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def tick(self) -> None:
        """One round: forget what went, follow every live console, sample every running sandbox."""
        held = self.service.held()
        ids = [s.id for s in held]
        for gone in [k for k in self._watches if k not in ids]:
            del self._watches[gone]
        self.history.keep_only(ids)
        self.logs.keep_only(ids)
        self.journal.keep_only(ids)
        live = [s for s in held if s.state.live]
        running = [s for s in live if s.state is SandboxState.RUNNING]
        for sandbox in held:
            if sandbox.state is not SandboxState.RUNNING and sandbox.id in self._watches:
                self._watches[sandbox.id].usage = None  # no CPU difference across a pause
        watches = {s.id: self._watch(s) for s in live}
        probes = {s.id: VmProbe.of(s.vm) for s in running}
        reads = await asyncio.to_thread(self._read_host, watches, probes)
        now, mono = self.clock(), self.monotonic()
        for sandbox in live:
            self._console_lines(sandbox.id, reads[sandbox.id].console, now)
        gate = asyncio.Semaphore(self.config.concurrency)
        await asyncio.gather(*(self._guest_view(s, watches[s.id], mono, gate) for s in running))
        for sandbox in running:
            self._sample(sandbox, watches[sandbox.id], reads[sandbox.id].usage, now, mono)
        self.ticks += 1

    # -- one sandbox ---------------------------------------------------------------------------------------

    def _watch(self, sandbox: Sandbox) -> Watch:
        watch = self._watches.get(sandbox.id)
        if watch is None or watch.vm_id != sandbox.vm.vm_id:  # a wake made it a new VM
            watch = Watch(sandbox.vm.vm_id, ConsoleCursor(sandbox.vm.paths.console_log))
            self._watches[sandbox.id] = watch
        return watch

    def _read_host(self, watches: dict[str, Watch], probes: dict[str, VmProbe]) -> dict[str, _HostRead]:
        """Every live sandbox's new console lines and every running one's usage (blocking: a thread)."""
        reads: dict[str, _HostRead] = {}
        for sandbox_id, watch in watches.items():
            probe = probes.get(sandbox_id)
            usage = read_usage(probe, self.proc) if probe is not None else None
            try:
                console = read_new(watch.console, self.config.console_bytes_per_tick)
            except OSError as err:
                log.debug("console of %s unreadable: %s", sandbox_id, err)
                console = ConsoleRead()
            reads[sandbox_id] = _HostRead(usage, console)
        return reads

    def _console_lines(self, sandbox_id: str, read: ConsoleRead, now: float) -> None:
        if read.skipped:
            limit = self.config.console_bytes_per_tick
            message = f"console: {read.skipped} bytes the guest wrote were skipped (more than {limit} per read)"
            self.journal.note(sandbox_id, "warn", message)
        for line in read.lines:
            self.logs.add(sandbox_id, now, "info", "console", line)

    async def _guest_view(self, sandbox: Sandbox, watch: Watch, mono: float, gate: asyncio.Semaphore) -> None:
        """Ask the guest for its memory (and, when due, its disk); a guest that does not answer keeps its last.
        Not while a lifecycle change or a capture holds the sandbox: nothing of ours is in flight in a snapshot."""
        memory_due = mono - watch.memory_asked >= self.config.memory_every_s
        disk_due = mono - watch.disk_at >= self.config.disk_every_s
        if sandbox.lock.locked() or not (memory_due or disk_due):
            return
        timeout = self.config.guest_timeout_s
        async with gate:
            try:
                guest = await sandbox.vm.connect_guest(timeout)
                if memory_due:
                    watch.memory_asked = mono
                    memory = await read_memory(guest, timeout)
                    if memory is not None:
                        watch.memory, watch.memory_at = memory, mono
                if disk_due:
                    watch.disk_at = mono  # also when it fails: not asked again before it is due
                    if watch.device_bytes is None:
                        watch.device_bytes = await read_device_bytes(guest, timeout)
                    if watch.device_bytes is not None:
                        watch.disk = await read_disk(guest, watch.device_bytes, timeout) or watch.disk
            except Exception as err:  # a busy, paused or hostile guest: its view waits for the next tick
                log.debug("guest view of %s: %s", sandbox.id, err)

    def _sample(self, sandbox: Sandbox, watch: Watch, usage: HostUsage | None, now: float, mono: float) -> None:
        if usage is None:
            return  # QEMU gone under us: nothing to say
        before, before_at = watch.usage, watch.usage_at
        watch.usage, watch.usage_at = usage, mono
        if before is None or before.source != usage.source:
            return  # a baseline: CPU is a difference
        fresh = watch.memory is not None and mono - watch.memory_at <= max(60.0, 3 * self.config.interval_s)
        ram = sandbox.memory_mib * MIB
        memory = watch.memory if fresh and watch.memory is not None else None
        disk = watch.disk or GuestDisk(0, 0)
        self.history.add(
            sandbox.id,
            Sample(
                timestamp=now,
                cpu_count=sandbox.cpus,
                cpu_pct=cpu_percent(before, usage, mono - before_at, sandbox.cpus),
                memory_bytes=usage.memory_bytes,
                mem_total=memory.total if memory is not None else ram,
                mem_used=memory.used if memory is not None else min(ram, usage.memory_bytes),
                mem_cache=memory.cache if memory is not None else 0,
                disk_total=disk.total,
                disk_used=disk.used,
                guest_view=memory is not None,
            ),
        )
