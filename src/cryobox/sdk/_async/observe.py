"""A sandbox's samples and log: ``metrics()`` and ``logs()`` (``AsyncSandbox`` has them through
``AsyncObserve``). Reading either never wakes the sandbox and never counts as activity. Example::

    series = await sbx.metrics(start=time.time() - 60)
    for sample in series.samples:
        print(sample.timestamp, sample.cpu_pct, sample.mem_used, sample.mem_total)
    page = await sbx.logs(level="warn")
    for entry in page.logs:
        print(entry.timestamp, entry.level, entry.source, entry.message)
    more = await sbx.logs(offset=page.next_offset)   # the next page (or new lines, later)
"""

from __future__ import annotations

from typing import Literal

import httpx

from ... import models
from .. import _observe
from .._base import RetryPolicy
from .._observe import When
from ._http import send


class AsyncObserve:
    """What a sandbox object needs to read its samples and log."""

    info: models.Sandbox
    _http: httpx.AsyncClient
    _retry: RetryPolicy

    async def metrics(self, start: When | None = None, end: When | None = None) -> models.SandboxMetrics:
        """The CPU and memory samples its agent took every few seconds (the last hour or so) in ``[start, end]``
        (datetimes or epoch seconds; either left out: open), oldest first. ``cpu_pct`` and ``memory_bytes`` are
        measured on the host; ``mem_*`` and ``disk_*`` are the guest's own view. A paused or hibernated sandbox
        is not sampled.

        :raises InvalidArgument: ``start`` is after ``end`` (nothing is sent).
        :raises NotFound: no such sandbox.
        """
        request = _observe.metrics_request(self.info.id, start=start, end=end)
        return _observe.parse_metrics(await send(self._http, request, self._retry))

    async def logs(
        self,
        *,
        offset: int | None = None,
        limit: int = 100,
        direction: Literal["forward", "backward"] = "forward",
        level: Literal["debug", "info", "warn", "error"] | None = None,
        search: str | None = None,
    ) -> models.SandboxLogs:
        """A page of the sandbox's log: its guest console's lines (``source == "console"``) and the agent's lines
        about it (``"agent"``: started, paused, hibernated, woken, network policy changed, …). ``forward`` from
        ``offset`` (oldest first), or ``backward`` before it (newest first); ``offset=page.next_offset`` continues
        in the same direction. ``level`` keeps that level and the more severe ones, ``search`` a case-sensitive
        substring. The agent keeps a bounded log (``dropped`` counts the oldest lines gone).

        :raises InvalidArgument: a value out of range (nothing is sent).
        :raises NotFound: no such sandbox.
        """
        request = _observe.logs_request(
            self.info.id, offset=offset, limit=limit, direction=direction, level=level, search=search
        )
        return _observe.parse_logs(await send(self._http, request, self._retry))


__all__ = ["AsyncObserve"]
