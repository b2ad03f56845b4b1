"""Python's cyclic garbage collector kept out of a start's way.

A full collection walks every object the process holds: after ``serve``'s imports about 180,000, 62-70 ms on a
quiet core of these machines, about twice that under a restart's load. During a restart's start it landed on
whichever step ran then: ``bench restart``'s step lines (:mod:`cryobox.util.steps`) showed a 0.11-0.15 s gap
wandering from step to step. :func:`hold` moves what exists by then (imports, what a standby prepared) out of the
collector's reach for good (``gc.freeze``: these live as long as the process) and pauses collection for the start;
:func:`release_once_serving` freezes what the start built (the app, the control plane, the host: long-lived too)
and resumes collection once the server serves, or :data:`HOLD_MAX_S` after the hold at most (a first start that bakes
templates for minutes collects as usual). Later full passes walk only what was allocated since. The price, as for
any ``gc.freeze``: reference cycles that were already garbage when frozen (what the imports and the start dropped
while collection was paused) are never freed; that is once per process, not per request.
"""

from __future__ import annotations

import asyncio
import gc

import uvicorn

HOLD_MAX_S = 10.0
POLL_S = 0.02


def hold(loop: asyncio.AbstractEventLoop, max_s: float = HOLD_MAX_S) -> asyncio.TimerHandle:
    """Freeze what exists and pause collection until :func:`release`, or ``max_s`` from now at most."""
    gc.freeze()
    gc.disable()
    return loop.call_later(max_s, release)


def release() -> None:
    """Freeze what exists and collect again (idempotent)."""
    gc.freeze()
    gc.enable()


async def release_once_serving(server: uvicorn.Server) -> None:
    """:func:`release` once ``server`` serves (or stops)."""
    try:
        while not server.started and not server.should_exit:
            await asyncio.sleep(POLL_S)
    finally:
        release()
