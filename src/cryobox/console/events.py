"""``GET /ui/api/events``: one server-sent event stream per console tab.

- ``sandboxes`` ``{"sandboxes": [...]}`` (the objects of ``GET /v1/sandboxes``): at the start, whenever the list
  changes (polled every second) and at least every 5 s;
- ``metrics``: every sample of :class:`~.sampler.MetricsSampler` (every 2 s), the latest one at the start;
- ``agents`` ``{"agents": [...]}`` (the objects of ``GET /v1/agents``): at the start, on change (polled every
  2 s) and at least every 10 s;
- ``snapshots`` ``{"snapshots": [...]}`` (``GET /v1/snapshots``) and ``templates`` ``{"templates": [...]}`` (the
  items of ``GET /v1/templates``, with a building template's progress): like ``agents``, polled every 2 s;
- ``error`` ``{"error", "code"}``, then the stream ends: the caller's key was revoked or its session ended
  (re-checked every 5 s, so a long-lived stream does not outlive its credentials).

The stream ends when the client goes away.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .sampler import MetricsSampler

Fetch = Callable[[], Awaitable[list[dict[str, Any]]]]


def sse(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass(frozen=True)
class Cadence:
    poll_s: float = 1.0
    sandboxes_every_s: float = 5.0
    agents_poll_s: float = 2.0
    agents_every_s: float = 10.0
    recheck_s: float = 5.0


async def event_stream(
    *,
    sandboxes: Fetch,
    agents: Fetch,
    sampler: MetricsSampler,
    snapshots: Fetch | None = None,
    templates: Fetch | None = None,
    still_allowed: Callable[[], Awaitable[bool]],
    disconnected: Callable[[], Awaitable[bool]],
    cadence: Cadence = Cadence(),
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[bytes]:
    yield b"retry: 3000\n\n"
    seq = sampler.seq
    history = sampler.history()
    if history:
        yield sse("metrics", history[-1])
    last: dict[str, tuple[float, str]] = {}
    polled: dict[str, float] = {}
    checked = clock()

    async def changed(name: str, fetch: Fetch, poll_s: float, every_s: float) -> bytes | None:
        now = clock()
        if name in polled and now - polled[name] < poll_s:
            return None
        polled[name] = now
        items = await fetch()
        text = json.dumps(items, sort_keys=True)
        sent = last.get(name)
        if sent is not None and sent[1] == text and now - sent[0] < every_s:
            return None
        last[name] = (now, text)
        return sse(name, {name: items})

    feeds = [
        ("sandboxes", sandboxes, cadence.poll_s, cadence.sandboxes_every_s),
        ("agents", agents, cadence.agents_poll_s, cadence.agents_every_s),
    ]
    feeds += [
        (name, fetch, cadence.agents_poll_s, cadence.agents_every_s)
        for name, fetch in (("snapshots", snapshots), ("templates", templates))
        if fetch is not None
    ]
    while True:
        for name, fetch, poll_s, every_s in feeds:
            event = await changed(name, fetch, poll_s, every_s)
            if event is not None:
                yield event
        seq, sample = await sampler.next_after(seq, cadence.poll_s)
        if sample is not None:
            yield sse("metrics", sample)
        if await disconnected():
            return
        if clock() - checked >= cadence.recheck_s:
            checked = clock()
            if not await still_allowed():
                yield sse("error", {"error": "the session ended or the API key was revoked", "code": "unauthorized"})
                return
