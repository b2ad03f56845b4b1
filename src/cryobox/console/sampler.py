"""The console's metrics sampler: every 2 s, the herd counters and the create-latency histogram read from the
same exposition as ``GET /metrics`` (this registry plus every external source), kept for 10 minutes in a ring and
handed to every ``/ui/api/events`` stream.

Series:

- ``herd.faults`` ← ``cryobox_fleet_faults_total``, ``herd.chunk_fetches`` ← ``cryobox_fleet_chunk_fetches_total``,
  ``herd.cache_hits`` ← ``cryobox_fleet_cache_hits_total``, ``herd.store_gets`` ← ``cryobox_fleet_store_gets_total``:
  the memory servers' counters of every live agent as the control plane gathers them
  (:mod:`cryobox.server.control.counters`), so a ``cryobox control`` replica shows its agents' and ``cryobox serve``
  counts its one memory server once (its own ``faults_total``... in the same text are not read);
- ``agents.<name>``: the same four per agent (``cryobox_agent_<counter>_total{agent}``) and ``up`` (it answered the
  last gather; ``false`` with the counters it last gave);
- ``creates.count`` / ``creates.sum_s`` / ``creates.buckets`` ← ``cryobox_create_duration_seconds_count``,
  ``_sum`` and ``_bucket{le}`` (cumulative, ``le`` ascending, ``+Inf`` last as ``null``).

All are cumulative counters, as Prometheus exports them: a chart takes differences between samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

HERD = ("faults", "chunk_fetches", "cache_hits", "store_gets")
HERD_SERIES = {f"cryobox_fleet_{key}_total": key for key in HERD}
AGENT_SERIES = {f"cryobox_agent_{key}_total": key for key in HERD}
AGENT_UP = "cryobox_agent_counters_up"
CREATE_HISTOGRAM = "cryobox_create_duration_seconds"
INTERVAL_S = 2.0
WINDOW_S = 600.0

Sample = dict[str, Any]
Source = Callable[[], Awaitable[str]]


def parse_sample(text: str, t: float) -> Sample:
    """One sample from a text exposition (unknown series are ignored; absent ones are 0)."""
    herd = dict.fromkeys(HERD, 0.0)
    agents: dict[str, dict[str, Any]] = {}
    count = total = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in HERD_SERIES:
                herd[HERD_SERIES[sample.name]] += sample.value
            elif sample.name in AGENT_SERIES or sample.name == AGENT_UP:
                row = agents.setdefault(sample.labels.get("agent", ""), {"up": False, **dict.fromkeys(HERD, 0)})
                if sample.name == AGENT_UP:
                    row["up"] = sample.value == 1
                else:
                    row[AGENT_SERIES[sample.name]] = int(sample.value)
            elif sample.name == CREATE_HISTOGRAM + "_count":
                count += sample.value
            elif sample.name == CREATE_HISTOGRAM + "_sum":
                total += sample.value
            elif sample.name == CREATE_HISTOGRAM + "_bucket":
                le = float(sample.labels.get("le", "+Inf"))
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return {
        "t": round(t, 3),
        "herd": {name: int(value) for name, value in herd.items()},
        "agents": dict(sorted(agents.items())),
        "creates": {
            "count": int(count),
            "sum_s": round(total, 6),
            "buckets": [[None if math.isinf(le) else le, int(n)] for le, n in sorted(buckets.items())],
        },
    }


class MetricsSampler:
    def __init__(
        self,
        source: Source,
        *,
        interval_s: float = INTERVAL_S,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self.interval_s = interval_s
        self._clock = clock
        self._ring: deque[Sample] = deque(maxlen=max(1, int(window_s / interval_s)))
        self._seq = 0
        self._changed = asyncio.Condition()

    async def sample_once(self) -> Sample:
        """Read the exposition now and append a sample (a failed read is logged; no sample then)."""
        text = await self._source()
        sample = parse_sample(text, self._clock())
        async with self._changed:
            self._ring.append(sample)
            self._seq += 1
            self._changed.notify_all()
        return sample

    def history(self) -> list[Sample]:
        return list(self._ring)

    @property
    def seq(self) -> int:
        return self._seq

    async def next_after(self, seq: int, timeout_s: float) -> tuple[int, Sample | None]:
        """Wait (at most ``timeout_s``) for a sample newer than ``seq``: ``(seq, sample)``, or the same ``seq``
        and ``None``."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self._seq > seq), timeout_s)
            if self._seq > seq and self._ring:
                return self._seq, self._ring[-1]
            return seq, None

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled, the first time one interval after the start: the first
        sample costs ~0.2 s of the loop (the agent's collectors' first run), which held up the app's start-up by
        as much, inside a restart's gap; the later ones ~25 ms."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sample_once()
            except Exception:
                log.exception("console metrics sample failed")


def exposition_source(render_all: Callable[[], Awaitable[tuple[bytes, str]]]) -> Source:
    async def read() -> str:
        body, _ = await render_all()
        return body.decode()

    return read
