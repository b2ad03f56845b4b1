"""Build, while the first requests are served, what FastAPI would build at a request's first match.

FastAPI 0.165 builds an included router's routes (each route's pydantic validators) the first time a request is
matched against that router. In a process that has just started, the first request paid for every router it was
matched against before its own: 56 ms for a create, 290 ms for an E2B call (whose routers come last) on a quiet
machine, several times that on a restart's busy one. Documenting the error responses by reference instead of by
model (``server/routes/errors.py``) made every router's build ~3.5 times cheaper (the sandboxes router 27 → 8 ms
quiet, all of them 320-470 → ~150 ms). :func:`warm_routes` builds them one router at a time on the
event loop, yielding between routers, so a request meanwhile waits for one router's build at most (and builds its
own if it comes first). It reaches FastAPI's routers by their methods (``effective_candidates``,
``effective_low_priority_routes``); a FastAPI without them is left as it is (``tests/unit/compose/test_warmup.py``
notices).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI


async def warm_routes(app: FastAPI) -> int:
    """Build every included router's routes; returns how many routers were built."""
    built = 0
    for _ in _routers(app.router.routes):
        built += 1
        await asyncio.sleep(0)
    return built


def _routers(routes: list[Any]) -> Iterator[None]:
    for route in routes:
        candidates = getattr(route, "effective_candidates", None)
        if not callable(candidates):
            continue
        children = candidates()  # builds this router's own routes
        low_priority = getattr(route, "effective_low_priority_routes", None)
        if callable(low_priority):
            low_priority()
        yield None
        yield from _routers(children)
