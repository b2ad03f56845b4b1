"""Long envd streams: the agent's events with keepalives in the quiet gaps, and a clean close either way.

The agent's iterator is pumped by one task of its own (so whatever it holds open — an HTTP stream to a remote
agent — is entered and left in the same task) into a one-slot queue. The consumer takes events as they come and
a keepalive (``None``) after every ``interval`` without one, like envd (``Keepalive-Ping-Interval`` seconds; the
SDK sends 50, envd's default is 90). Closing the consumer (the client went away, the deadline passed, the
handler returned) cancels the pump, which closes the agent's iterator: the guest detaches, its process keeps
running.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

KEEPALIVE_HEADER = "keepalive-ping-interval"
DEFAULT_KEEPALIVE_S = 90.0
MIN_KEEPALIVE_S = 0.01

T = TypeVar("T")


def keepalive_interval(headers: Mapping[str, str], default: float = DEFAULT_KEEPALIVE_S) -> float:
    """The ``Keepalive-Ping-Interval`` header in seconds (envd's default when absent or invalid)."""
    raw = headers.get(KEEPALIVE_HEADER)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    if not math.isfinite(value) or value <= 0:
        return default
    return max(value, MIN_KEEPALIVE_S)


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class _End:
    pass


_END = _End()


class _Pump(Generic[T]):
    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source
        self.queue: asyncio.Queue[T | _Failed | _End] = asyncio.Queue(maxsize=1)

    async def run(self) -> None:
        try:
            async for item in self._source:
                await self.queue.put(item)
        except Exception as err:  # delivered to the consumer; a cancellation is not
            await self.queue.put(_Failed(err))
        else:
            await self.queue.put(_END)
        finally:
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


async def with_keepalive(
    source: AsyncIterator[T], interval: float, *, quiet_until_first: bool = False
) -> AsyncGenerator[T | None, None]:
    """``source``'s items, and ``None`` after every ``interval`` seconds without one (with ``quiet_until_first``,
    none before the first item: a process stream's first event must be its start). Its errors are raised here;
    closing this generator (use :func:`contextlib.aclosing`) closes ``source`` before the close returns."""
    pump = _Pump(source)
    task = asyncio.create_task(pump.run(), name="envd-stream-pump")
    started = not quiet_until_first
    try:
        while True:
            try:
                item = await asyncio.wait_for(pump.queue.get(), interval)
            except TimeoutError:
                if started:
                    yield None
                continue
            started = True
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        task.cancel()
        await asyncio.wait({task})  # a cancellation of our own still propagates
        if not task.cancelled():
            task.exception()  # retrieved: the pump hands its errors over through the queue
