"""Placement with in-flight reservations: capacity is taken when the scheduler decides, not when work arrives.

A herd of creates is decided in a burst, long before any of them shows up in a host's own count of running
sandboxes. A scheduler that looks only at those counts sends the whole burst to the host that looked emptiest.
:class:`Placement` therefore counts the reservations it has handed out::

    free(host) = slots_total - used_fn() - reserved

:meth:`Placement.reserve` picks the host with the most free capacity (ties go to the first host by name) and
holds ``cost`` slots there. The caller then either calls :meth:`Reservation.commit` (the work started, so the
host's own ``used_fn`` now includes it and the reservation stops counting) or :meth:`Reservation.release`
(nothing was started). A reservation that is neither committed nor released within ``reservation_ttl_s`` expires,
so a lost request cannot leak capacity. When no host fits, ``reserve`` raises
:class:`~cryobox.errors.HostUnavailable` (HTTP 503 with ``Retry-After``).

Thread-safe; never blocks beyond a short lock, so it is also safe to call from an event loop.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from ..errors import HostUnavailable, InvalidArgument, StateError

log = logging.getLogger(__name__)

DEFAULT_RESERVATION_TTL_S = 60.0
DEFAULT_RETRY_AFTER_S = 1.0

ReservationState = Literal["pending", "committed", "released", "expired"]


@dataclass(frozen=True)
class HostCapacity:
    """One host: ``slots_total`` slots, of which ``used_fn()`` are taken by work that has already started.

    ``used_fn`` is called under the placement lock on every decision: it must be cheap, must not block and
    must not call back into the :class:`Placement`.
    """

    name: str
    slots_total: int
    used_fn: Callable[[], int]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument(f"host name must be a non-empty string, got {self.name!r}")
        if isinstance(self.slots_total, bool) or not isinstance(self.slots_total, int) or self.slots_total < 0:
            raise InvalidArgument(f"slots_total of {self.name!r} must be an integer >= 0, got {self.slots_total!r}")


class Reservation(AbstractContextManager["Reservation"]):
    """``cost`` slots held on ``host`` until committed, released or expired.

    As a context manager it releases on exit unless :meth:`commit` was called inside the block.
    """

    __slots__ = ("_placement", "id", "host", "cost", "expires_at", "_state")

    def __init__(self, placement: Placement, ident: int, host: str, cost: int, expires_at: float) -> None:
        self._placement = placement
        self.id = ident
        self.host = host
        self.cost = cost
        self.expires_at = expires_at
        self._state: ReservationState = "pending"

    @property
    def state(self) -> ReservationState:
        return self._state

    def commit(self) -> None:
        """The work started on ``host``: its own count now includes it. Idempotent; refused after release."""
        self._placement._settle(self, commit=True)

    def release(self) -> None:
        """Nothing was started: give the slots back. Idempotent; a no-op after commit or expiry."""
        self._placement._settle(self, commit=False)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Reservation(id={self.id}, host={self.host!r}, cost={self.cost}, state={self._state!r})"


class Placement:
    """Chooses a host for new work, counting reservations already handed out."""

    def __init__(
        self,
        hosts: Iterable[HostCapacity],
        clock: Callable[[], float] = time.monotonic,
        *,
        reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        count_reservations: bool = True,
    ) -> None:
        """``count_reservations=False`` is the naive scheduler (free = total - used), kept for comparison."""
        ordered = sorted(hosts, key=lambda h: h.name)
        if not ordered:
            raise InvalidArgument("placement needs at least one host")
        names = [h.name for h in ordered]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidArgument(f"duplicate host name(s): {', '.join(duplicates)}")
        if not math.isfinite(reservation_ttl_s) or reservation_ttl_s <= 0:
            raise InvalidArgument(f"reservation_ttl_s must be a finite number > 0, got {reservation_ttl_s}")
        if not math.isfinite(retry_after_s) or retry_after_s <= 0:
            raise InvalidArgument(f"retry_after_s must be a finite number > 0, got {retry_after_s}")
        self._hosts: tuple[HostCapacity, ...] = tuple(ordered)
        self._clock = clock
        self._ttl_s = reservation_ttl_s
        self._retry_after_s = retry_after_s
        self._count_reservations = count_reservations
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, Reservation] = {}
        self._reserved: dict[str, int] = {h.name: 0 for h in ordered}

    @classmethod
    def single(
        cls,
        name: str,
        slots_total: int,
        used_fn: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> Placement:
        """The one-host default (``cryobox serve``)."""
        return cls([HostCapacity(name, slots_total, used_fn)], clock, **kwargs)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h.name for h in self._hosts)

    def reserve(self, cost: int = 1) -> Reservation:
        """Hold ``cost`` slots on the host with the most free capacity, or raise ``HostUnavailable``."""
        if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
            raise InvalidArgument(f"reservation cost must be an integer > 0, got {cost!r}")
        with self._lock:
            now = self._clock()
            self._expire(now)
            best: HostCapacity | None = None
            best_free = 0
            frees: dict[str, int] = {}
            for host in self._hosts:  # sorted by name, and only a strictly larger free wins: ties go by name
                free = frees[host.name] = self._free(host)
                if free >= cost and (best is None or free > best_free):
                    best, best_free = host, free
            if best is None:
                raise HostUnavailable(
                    f"no host has {cost} free slot(s)",
                    retry_after_s=self._retry_after_s,
                    details={"cost": cost, "free": {name: max(0, f) for name, f in frees.items()}},
                )
            reservation = Reservation(self, next(self._ids), best.name, cost, now + self._ttl_s)
            self._pending[reservation.id] = reservation
            self._reserved[best.name] += cost
            return reservation

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per host: ``total``, ``used`` (started work), ``reserved`` (pending reservations), ``free`` (>= 0)."""
        with self._lock:
            self._expire(self._clock())
            out: dict[str, dict[str, int]] = {}
            for host in self._hosts:
                used = host.used_fn()
                reserved = self._reserved[host.name]
                free = host.slots_total - used - (reserved if self._count_reservations else 0)
                out[host.name] = {"total": host.slots_total, "used": used, "reserved": reserved, "free": max(0, free)}
            return out

    # -- internals ---------------------------------------------------------------------------------------

    def _free(self, host: HostCapacity) -> int:
        reserved = self._reserved[host.name] if self._count_reservations else 0
        return host.slots_total - host.used_fn() - reserved

    def _expire(self, now: float) -> None:
        for reservation in [r for r in self._pending.values() if r.expires_at <= now]:
            self._drop(reservation, "expired")
            log.warning("placement reservation %d on %s expired uncommitted", reservation.id, reservation.host)

    def _drop(self, reservation: Reservation, state: ReservationState) -> None:
        if self._pending.pop(reservation.id, None) is not None:
            self._reserved[reservation.host] -= reservation.cost
        reservation._state = state

    def _settle(self, reservation: Reservation, *, commit: bool) -> None:
        with self._lock:
            state = reservation._state
            if commit:
                if state == "released":
                    raise StateError(
                        f"reservation {reservation.id} on {reservation.host} was released",
                        state=state,
                        required="pending",
                    )
                if state != "committed":  # pending, or expired but the work started anyway
                    self._drop(reservation, "committed")
            elif state == "pending":
                self._drop(reservation, "released")
