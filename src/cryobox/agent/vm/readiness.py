"""A guest not yet known to answer: what guest calls on an adopted VM wait for.

A restarted agent serves before it has pinged every guest it adopted (:mod:`cryobox.agent.host.adopt`): each VM
carries a :class:`GuestReadiness` until its own ping is answered, and :meth:`.microvm.MicroVM.connect_guest`
waits on it. A call that waits marks its guest ``wanted``, and the adoption checks a wanted guest at once, ahead
of the others still queued (:func:`wait_turn`): the first request after a restart waits for one guest, not all.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from ...errors import GuestError


class GuestReadiness:
    """Settled once: ready (``settle()``) or not (``settle(error)``: every waiter, now and later, gets a
    :class:`~cryobox.errors.GuestError` saying why)."""

    def __init__(self) -> None:
        self.wanted = asyncio.Event()
        """Set when a call first waits."""
        self._settled = asyncio.Event()
        self._error: BaseException | None = None

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    async def wait(self) -> None:
        if not self._settled.is_set():
            self.wanted.set()
            await self._settled.wait()
        if self._error is not None:
            raise GuestError(f"the guest did not come back after the agent's restart: {self._error}")

    def settle(self, error: BaseException | None = None) -> None:
        if self._settled.is_set():
            return
        self._error = error
        self._settled.set()


class WantedLock(asyncio.Lock):
    """The lock of a sandbox still being adopted (taken by its adoption): whoever waits for it — a lifecycle
    change, which takes the lock but makes no guest call — marks the adoption ``wanted`` as a guest call does."""

    def __init__(self, wanted: asyncio.Event) -> None:
        super().__init__()
        self._wanted = wanted

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self._wanted.set()
        return await super().acquire()


async def wait_turn(gate: asyncio.Semaphore, wanted: asyncio.Event) -> bool:
    """Wait for a place under ``gate`` or for ``wanted``, whichever comes first. True: a place is held (release
    it); False: wanted first, and no place is held (the caller goes ahead of the queue)."""
    if wanted.is_set():
        return False
    acquire = asyncio.ensure_future(gate.acquire())
    want = asyncio.ensure_future(wanted.wait())
    try:
        await asyncio.wait({acquire, want}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        want.cancel()
        acquire.cancel()
        if acquire.done() and not acquire.cancelled():
            gate.release()
        raise
    want.cancel()
    if acquire.done():
        return True
    acquire.cancel()  # asyncio's semaphore hands a place it woke a cancelled waiter with to the next one
    return False
