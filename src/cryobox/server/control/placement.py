"""Placement with in-flight reservations: capacity is taken when the control plane decides, not when work lands.

A herd of creates is decided in a burst, long before any of it shows up in an agent's own numbers. Each
decision therefore runs in one registry transaction that locks the agent rows (PostgreSQL ``FOR UPDATE``;
SQLite's write lock), sees every agent's committed load (its sandbox rows) *and* the reservations already
handed out by any control-plane replica, picks an agent with :func:`choose`, and inserts a reservation
(:meth:`cryobox.registry.fleet.FleetRecords.reserve`). The create then either commits it (the sandbox row is
inserted and the reservation deleted in one transaction) or releases it; one that is neither expires after
``ttl_s``, so a lost request cannot leak capacity. No agent fits: :class:`~cryobox.errors.HostUnavailable`
(503 ``capacity`` with ``Retry-After``).

While this process holds reservations it renews them every third of ``ttl_s`` (one ``UPDATE`` for all): a
request slower than the TTL (a restore on a loaded TCG host, a wake fetching its volumes) keeps its room, and
its sandbox — listed by its agent before the row exists — is never taken for a stray
(:mod:`.strays`). Only a replica that died stops renewing; its reservations then expire as before.

:func:`choose` is the policy, a pure function: among live agents that serve the template (the right generation
for a snapshot) and have the memory and a sandbox slot free, the highest score wins::

    score = free memory (MiB) - IN_FLIGHT_PENALTY_MIB x reservations in flight + locality bonus

where the bonus goes to an agent already holding the memory (the template's or snapshot's hot copy, or the
snapshot's files). A full agent is never chosen; a burst spreads because every reservation lowers its agent's
score; ties go to the first agent by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import StateError
from ...registry import AgentLoad, AgentRow, Registry, ReservationRow, SandboxRow

log = logging.getLogger(__name__)

DEFAULT_RESERVATION_TTL_S = 60.0
IN_FLIGHT_PENALTY_MIB = 512
LOCALITY_BONUS_MIB = 1024


@dataclass(frozen=True)
class PlacementRequest:
    memory_mib: int
    cpus: int
    template: str
    generation: str | None = None
    """Only agents serving this generation of the template (a snapshot restores over its own)."""
    local_keys: frozenset[str] = field(default_factory=frozenset)
    """Hot images or snapshot ids whose holder gets the locality bonus."""
    prefer: str | None = None
    """An agent that gets the locality bonus outright (the one holding a snapshot's files)."""
    only: str | None = None
    """Only this agent (a fork boots from a copy of the parent's disk, which is there)."""
    locality_bonus_mib: int = LOCALITY_BONUS_MIB
    avoid: frozenset[str] = frozenset()
    """Not these agents (the full host a create's volumes move away from)."""


def free_memory_mib(load: AgentLoad) -> int:
    total = int(load.agent.capacity.get("memory_total_mib", 0))
    pooled = int(load.agent.capacity.get("memory_pooled_mib", 0))  # warm-pool QEMUs hold memory too
    return total - pooled - load.committed_memory_mib - load.reserved_memory_mib


def free_slots(load: AgentLoad) -> int:
    total = int(load.agent.capacity.get("max_sandboxes", 0))
    return total - load.sandboxes - load.reservations


def serves(load: AgentLoad, template: str, generation: str | None) -> bool:
    ready = load.agent.capacity.get("templates_ready") or {}
    return template in ready and (generation is None or ready[template] == generation)


def score(request: PlacementRequest, load: AgentLoad) -> int:
    held = set(load.agent.capacity.get("hot_images") or []) | set(load.agent.capacity.get("local_snapshots") or [])
    local = load.agent.name == request.prefer or bool(held & request.local_keys)
    return (
        free_memory_mib(load) - IN_FLIGHT_PENALTY_MIB * load.reservations + (request.locality_bonus_mib if local else 0)
    )


def choose(request: PlacementRequest, loads: list[AgentLoad]) -> str | None:
    """The agent for ``request`` (see the module docstring), or ``None`` when none fits."""
    best: tuple[int, str] | None = None
    for load in sorted(loads, key=lambda item: item.agent.name):
        if (request.only is not None and load.agent.name != request.only) or load.agent.name in request.avoid:
            continue
        if load.agent.status != "up" or not serves(load, request.template, request.generation):
            continue
        if free_memory_mib(load) < request.memory_mib or free_slots(load) < 1:
            continue
        value = score(request, load)
        if best is None or value > best[0]:
            best = (value, load.agent.name)
    return best[1] if best is not None else None


def require_servable(request: PlacementRequest, agents: list[AgentRow]) -> None:
    """Refuse (409, nothing reserved) a restore whose template generation no registered agent serves.

    Waiting cannot help such a create: the snapshot was taken on a generation (template, kernel, QEMU version)
    that every agent has moved past, so it is not the 503 ``capacity`` of a full or silent fleet. An agent that
    serves it but is down, draining or full still gets the 503 from :meth:`Placement.reserve`.
    """
    if request.generation is None:
        return
    candidates = [a for a in agents if request.only is None or a.name == request.only]
    served = {a.name: (a.capacity.get("templates_ready") or {}).get(request.template) for a in candidates}
    if request.generation in served.values():
        return
    raise StateError(
        f"no agent serves generation {request.generation} of template {request.template!r} any more (the snapshot "
        "was taken on another template build or QEMU version); restore it where that generation runs",
        state=f"generation {request.generation}",
        required="an agent serving it",
        details={"generation": request.generation, "template": request.template, "served": served},
    )


class Placement:
    """Reserve / commit / release against the registry (shared by every control-plane replica); the reservations
    this process handed out are renewed until they are committed, released or gone (see the module docstring)."""

    def __init__(
        self,
        registry: Registry,
        *,
        deadline_s: float,
        ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        clock: Callable[[], float] = time.time,
        renew_every_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.deadline_s = deadline_s
        self.ttl_s = ttl_s
        self.clock = clock
        self.renew_every_s = ttl_s / 3 if renew_every_s is None else renew_every_s
        self._held: set[str] = set()
        self._renewing: asyncio.Task[None] | None = None

    async def reserve(self, request: PlacementRequest, sandbox_id: str | None = None) -> ReservationRow:
        now = self.clock()
        if request.generation is not None:  # a snapshot's: is its generation served anywhere (409 if not)
            require_servable(request, await asyncio.to_thread(self.registry.fleet.list_agents))
        reservation = await asyncio.to_thread(
            lambda: self.registry.fleet.reserve(
                memory_mib=request.memory_mib,
                cpus=request.cpus,
                now=now,
                ttl_s=self.ttl_s,
                choose=lambda loads: choose(request, loads),
                sandbox_id=sandbox_id,
                live_after=now - self.deadline_s,
            )
        )
        self._hold(reservation.id)
        return reservation

    async def commit(self, reservation: ReservationRow, row: SandboxRow) -> None:
        await asyncio.to_thread(self.registry.fleet.commit, reservation.id, row)
        self._held.discard(reservation.id)

    async def release(self, reservation: ReservationRow) -> None:
        await asyncio.to_thread(self.registry.fleet.release, reservation.id)
        self._held.discard(reservation.id)

    @property
    def held(self) -> frozenset[str]:
        """The reservations this process is renewing."""
        return frozenset(self._held)

    def _hold(self, reservation_id: str) -> None:
        self._held.add(reservation_id)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew(), name="reservation-renewal")

    async def _renew(self) -> None:
        """Renew what is held until nothing is (ended elsewhere too: a wake's move deletes its reservation in the
        transaction that moves the row, so an id the registry no longer stores is dropped here)."""
        while self._held:
            await asyncio.sleep(self.renew_every_s)
            ids = set(self._held)
            try:
                stored = await asyncio.to_thread(self.registry.fleet.extend, ids, self.clock() + self.ttl_s)
            except Exception:  # the registry is unreachable: the next round tries again
                log.exception("renewing %d reservation(s) failed", len(ids))
                continue
            self._held -= ids - stored

    async def close(self) -> None:
        """Stop renewing (the process is ending; what it still holds expires after ``ttl_s``)."""
        task, self._renewing = self._renewing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
