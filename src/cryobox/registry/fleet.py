"""The fleet's shared state: host agents, capacity reservations and per-host reconciliation.

Several control-plane replicas share one registry (PostgreSQL in a fleet) and place creates on several host
agents. :meth:`FleetRecords.reserve` makes placement safe across processes: it takes the agents' row locks
(``SELECT ... FROM agents ORDER BY name FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already holds the
database's write lock), reads every live agent's load in one statement and inserts the reservation in the same
transaction, so two reservers never see the same free room. :meth:`FleetRecords.commit` swaps a reservation for
its sandbox row atomically, so a load never counts both or neither.

Lock order, to keep PostgreSQL free of deadlocks: agent rows first, always in name order, then sandbox and
reservation rows. Reconciliation touches only the rows of the host it is given.

Every method is synchronous, runs one short transaction and returns frozen dataclasses, like :class:`Registry`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session

from ..errors import HostUnavailable, InvalidArgument, NotFound
from ..util.sealing import Sealer
from . import envseal
from . import models as m
from .db import AlreadyExists, Database
from .loads import agent_loads, free_memory
from .rows import (
    ACTIVE_STATUSES,
    AGENT_DOWN,
    AGENT_DRAINING,
    AGENT_STATUSES,
    AGENT_UP,
    HIBERNATED,
    HIBERNATION_LOCAL,
    HIBERNATION_STORED,
    LOST,
    AgentLoad,
    AgentRow,
    HeartbeatOutcome,
    HostReconcile,
    ReservationRow,
    SandboxRow,
    _check_fields,
    _chunks,
    _from_orm,
)

ABSENT_STATUSES = (*ACTIVE_STATUSES, HIBERNATED, LOST)
"""Statuses of a sandbox row that claim its VM exists on the host: such a row absent from the agent's report is
marked ``lost`` (or the caller's ``absent_status``), except a hibernated one whose image is in the object store:
that one is portable (any agent can wake it), so it stays ``hibernated``."""


def _claims_vm() -> Any:
    """WHERE clause of the sandbox rows whose VM (or hibernation image) only their host has: active ones, and
    hibernated ones whose image is not in the object store (those outlive their host)."""
    portable = and_(m.Sandbox.status == HIBERNATED, m.Sandbox.hibernation == HIBERNATION_STORED)
    return and_(m.Sandbox.status.in_((*ACTIVE_STATUSES, HIBERNATED)), or_(m.Sandbox.hibernation.is_(None), ~portable))


class FleetRecords:
    """Agents, reservations and per-host reconciliation on a shared :class:`Database` (``Registry.fleet``);
    ``sealer`` seals the env of the sandbox rows :meth:`commit` writes."""

    def __init__(self, db: Database, sealer: Sealer) -> None:
        self._db = db
        self._sealer = sealer

    # -- agents ----------------------------------------------------------------------------------------------

    def heartbeat(
        self,
        name: str,
        *,
        url: str,
        boot_id: str,
        capacity: Mapping[str, Any],
        info: Mapping[str, Any],
        now: float,
    ) -> HeartbeatOutcome:
        """Record an agent's heartbeat (its registration when there is no row yet); safe against concurrent callers.

        The agent becomes ``up`` unless it is ``draining`` (a heartbeat keeps that). ``new_boot`` when there was no
        row or the boot id changed (the agent restarted: reconcile its rows), ``was_down`` when it had been marked
        ``down``. A new boot also resets ``registered_at``; ``heartbeat_at`` never moves backwards.
        """
        _check_name(name)
        values = _check_fields(
            AgentRow,
            {"url": url, "boot_id": boot_id, "capacity": dict(capacity), "info": dict(info), "heartbeat_at": now},
        )
        for _ in range(2):
            try:
                with self._db.session(what=f"agent {name!r}") as s:
                    obj = s.get(m.Agent, name, with_for_update=True)
                    if obj is None:
                        s.add(m.Agent(name=name, status=AGENT_UP, registered_at=values["heartbeat_at"], **values))
                        s.flush()
                        return HeartbeatOutcome(new_boot=True, was_down=False, status=AGENT_UP)
                    new_boot = obj.boot_id != boot_id
                    was_down = obj.status == AGENT_DOWN
                    if obj.status != AGENT_DRAINING:
                        obj.status = AGENT_UP
                    if new_boot:
                        obj.registered_at = values["heartbeat_at"]
                    obj.url = values["url"]
                    obj.boot_id = values["boot_id"]
                    obj.capacity = values["capacity"]
                    obj.info = values["info"]
                    obj.heartbeat_at = max(obj.heartbeat_at, values["heartbeat_at"])
                    return HeartbeatOutcome(new_boot=new_boot, was_down=was_down, status=obj.status)
            except AlreadyExists:
                continue  # registered by a concurrent caller in between: update it
        raise AssertionError("unreachable: agent neither inserted nor updated")  # pragma: no cover

    def update_capacity(self, name: str, capacity: Mapping[str, Any]) -> None:
        """Record an agent's capacity between heartbeats (a template it has just built is servable at once).

        :raises NotFound: no such agent."""
        values = _check_fields(AgentRow, {"capacity": dict(capacity)})
        with self._db.session(what=f"agent {name!r}") as s:
            obj = _agent(s, name)
            obj.capacity = values["capacity"]

    def list_agents(self) -> list[AgentRow]:
        with self._db.session(write=False) as s:
            return [_from_orm(obj, AgentRow) for obj in s.scalars(select(m.Agent).order_by(m.Agent.name))]

    def get_agent(self, name: str) -> AgentRow:
        """:raises NotFound: no such agent."""
        with self._db.session(write=False) as s:
            return _from_orm(_agent(s, name), AgentRow)

    def set_agent_status(self, name: str, status: str) -> AgentRow:
        """Set ``up``, ``down`` or ``draining`` (e.g. an operator draining a host). :raises NotFound: no such agent."""
        if status not in AGENT_STATUSES:
            raise InvalidArgument(
                f"agent status must be one of {', '.join(AGENT_STATUSES)}, not {status!r}", details={"status": status}
            )
        with self._db.session(what=f"agent {name!r}") as s:
            obj = _agent(s, name, lock=True)
            obj.status = status
            s.flush()
            return _from_orm(obj, AgentRow)

    def mark_stale(self, now: float, deadline_s: float) -> list[str]:
        """Agents ``up``/``draining`` whose last heartbeat is older than ``now - deadline_s`` become ``down``.

        Every sandbox row of those hosts whose status is active or ``hibernated`` becomes ``lost`` (a later
        heartbeat's :meth:`reconcile_host` brings back those the agent still runs), except hibernated ones whose
        image is in the object store (they stay ``hibernated``: any agent can wake them). Returns the agents' names,
        sorted. Idempotent; several replicas may run it at once (the second finds nothing left to do).
        """
        cutoff = now - deadline_s
        with self._db.session(what="stale agents") as s:
            stale = list(
                s.scalars(
                    select(m.Agent.name)
                    .where(m.Agent.status.in_((AGENT_UP, AGENT_DRAINING)), m.Agent.heartbeat_at < cutoff)
                    .order_by(m.Agent.name)
                    .with_for_update()
                )
            )
            for chunk in _chunks(stale):
                s.execute(update(m.Agent).where(m.Agent.name.in_(chunk)).values(status=AGENT_DOWN))
                s.execute(update(m.Sandbox).where(m.Sandbox.host.in_(chunk), _claims_vm()).values(status=LOST))
            return stale

    # -- reservations ----------------------------------------------------------------------------------------

    def reserve(
        self,
        *,
        memory_mib: int,
        cpus: int,
        now: float,
        ttl_s: float,
        choose: Callable[[list[AgentLoad]], str | None],
        sandbox_id: str | None = None,
        live_after: float,
    ) -> ReservationRow:
        """Hold ``memory_mib``/``cpus`` on the agent ``choose`` picks, in one write transaction.

        Expired reservations (``expires_at <= now``) are deleted first. ``choose`` gets the load of every agent that
        is ``up`` with ``heartbeat_at >= live_after`` (sorted by name) and returns one of their names, or ``None``
        when none has room: then :class:`HostUnavailable` is raised and nothing changes. ``choose`` runs while
        the agents are locked: it must be quick and must not use the registry. A ``sandbox_id`` that already holds an
        unexpired reservation (a hibernated sandbox being woken elsewhere by another request) is refused the same way.
        """
        if not _is_int(memory_mib) or memory_mib < 0 or not _is_int(cpus) or cpus < 0:
            raise InvalidArgument(
                "a reservation needs whole non-negative memory_mib and cpus",
                details={"memory_mib": memory_mib, "cpus": cpus},
            )
        if not ttl_s > 0:
            raise InvalidArgument("a reservation's ttl_s must be positive", details={"ttl_s": ttl_s})
        with self._db.session(what="reservation") as s:
            # the row locks serialize reservers across processes (SQLite: BEGIN IMMEDIATE did already); loads are
            # built only from rows this transaction locked, so whatever it picks no one else can pick meanwhile
            agents = list(s.scalars(select(m.Agent).order_by(m.Agent.name).with_for_update()))
            s.execute(delete(m.Reservation).where(m.Reservation.expires_at <= now))
            if sandbox_id is not None and s.scalar(
                select(m.Reservation.id).where(m.Reservation.sandbox_id == sandbox_id).limit(1)
            ):
                raise HostUnavailable(
                    f"sandbox {sandbox_id} is being placed by another request",
                    retry_after_s=2.0,
                    details={"sandbox_id": sandbox_id},
                )
            live = [a for a in agents if a.status == AGENT_UP and a.heartbeat_at >= live_after]
            loads = agent_loads(s, live, now)
            chosen = choose(list(loads))
            if chosen is None:
                raise HostUnavailable(
                    f"no agent has room for {memory_mib} MiB and {cpus} vCPU(s) ({len(loads)} live)",
                    retry_after_s=1.0,
                    details={
                        "memory_mib": memory_mib,
                        "cpus": cpus,
                        "live_agents": len(loads),
                        "free_memory_mib": {load.agent.name: free_memory(load) for load in loads},
                    },
                )
            if chosen not in {load.agent.name for load in loads}:
                raise InvalidArgument(
                    f"placement chose {chosen!r}, which is not a live agent", details={"agent": chosen}
                )
            obj = m.Reservation(
                id=f"rsv-{secrets.token_hex(8)}",
                agent=chosen,
                sandbox_id=sandbox_id,
                memory_mib=memory_mib,
                cpus=cpus,
                created_at=float(now),
                expires_at=float(now) + float(ttl_s),
            )
            s.add(obj)
            s.flush()
            return _from_orm(obj, ReservationRow)

    def commit(self, reservation_id: str, row: SandboxRow) -> None:
        """Insert the sandbox row and delete its reservation in one transaction (an expired one is fine)."""
        with self._db.session(what=f"sandbox {row.id}") as s:
            s.add(envseal.to_orm(row, self._sealer))
            s.flush()
            s.execute(delete(m.Reservation).where(m.Reservation.id == reservation_id))

    def release(self, reservation_id: str) -> None:
        """Give the room back (idempotent)."""
        with self._db.session(what=f"reservation {reservation_id}") as s:
            s.execute(delete(m.Reservation).where(m.Reservation.id == reservation_id))

    def extend(self, reservation_ids: Collection[str], expires_at: float) -> set[str]:
        """Push the expiry of the still-stored ``reservation_ids`` to ``expires_at`` (never earlier); the ids
        still stored are returned (one committed, released or expired-and-deleted meanwhile is not)."""
        ids = sorted(set(reservation_ids))
        if not ids:
            return set()
        with self._db.session(what="reservations") as s:
            present = set(s.scalars(select(m.Reservation.id).where(m.Reservation.id.in_(ids))))
            if present:
                s.execute(
                    update(m.Reservation)
                    .where(m.Reservation.id.in_(present), m.Reservation.expires_at < expires_at)
                    .values(expires_at=float(expires_at))
                )
            return present

    def reservations(self, agent: str | None = None) -> list[ReservationRow]:
        """Stored reservations, oldest first (expired ones stay until the next :meth:`reserve` deletes them)."""
        query = select(m.Reservation).order_by(m.Reservation.created_at, m.Reservation.id)
        if agent is not None:
            query = query.where(m.Reservation.agent == agent)
        with self._db.session(write=False) as s:
            return [_from_orm(obj, ReservationRow) for obj in s.scalars(query)]

    # -- reconciliation --------------------------------------------------------------------------------------

    def host_statuses(self, host: str) -> dict[str, str]:
        """Sandbox id -> status of ``host``'s rows."""
        with self._db.session(write=False) as s:
            return {
                i: status
                for i, status in s.execute(select(m.Sandbox.id, m.Sandbox.status).where(m.Sandbox.host == host))
            }

    def reconcile_host(
        self,
        host: str,
        reported: Mapping[str, str],
        *,
        snapshot_dir_exists: Callable[[str], bool] | None = None,
        absent_status: str | None = LOST,
        expected: Mapping[str, str] | None = None,
    ) -> HostReconcile:
        """Make the rows of ``host`` (and only those) agree with what its agent reports.

        ``reported`` maps sandbox id -> status and is authoritative: the host's rows it names get that status
        (a ``lost`` row comes back; a row that stops being ``hibernated`` forgets its hibernation); the host's rows
        it does not name whose status is active, ``hibernated`` (unless its image is stored: it stays) or
        ``lost`` get ``absent_status`` (``None``: absent rows are left alone, e.g. for a routine heartbeat while
        creates and deletes are in flight). Reported ids without a row of this host are ignored. With
        ``snapshot_dir_exists``, the host's ``local`` snapshot rows whose files are gone are deleted (``stored``
        ones stay: other hosts can fetch them). With ``expected`` (id -> status) a reported row changes only while
        its status is still the expected one (compare-and-set: another writer's change since wins).
        """
        for sandbox_id, status in reported.items():
            if not isinstance(sandbox_id, str) or not isinstance(status, str) or not status:
                raise InvalidArgument(
                    "reported sandboxes must map ids to non-empty statuses", details={"sandbox_id": str(sandbox_id)}
                )
        gone: list[str] = []
        if snapshot_dir_exists is not None:  # file checks outside the write transaction
            with self._db.session(write=False) as s:
                local = s.execute(select(m.Snapshot.id, m.Snapshot.path).where(*_local_snapshots(host))).all()
            gone = sorted(snapshot_id for snapshot_id, path in local if not snapshot_dir_exists(path))
        with self._db.session(what=f"reconciliation of host {host!r}") as s:
            # the agent's row lock serializes this with mark_stale and reservers (agents before sandboxes)
            s.execute(select(m.Agent.name).where(m.Agent.name == host).with_for_update())
            rows = s.execute(
                select(m.Sandbox.id, m.Sandbox.status, m.Sandbox.hibernation).where(m.Sandbox.host == host)
            ).all()
            targets: dict[str, list[str]] = {}
            updated: list[str] = []
            lost: list[str] = []
            for sandbox_id, status, hibernation in rows:
                if status == HIBERNATED and hibernation == HIBERNATION_STORED and sandbox_id not in reported:
                    continue  # portable: any agent can wake it from the store
                if sandbox_id in reported:
                    if expected is not None and expected.get(sandbox_id) != status:
                        continue  # changed since it was read
                    if reported[sandbox_id] != status:
                        targets.setdefault(reported[sandbox_id], []).append(sandbox_id)
                        updated.append(sandbox_id)
                elif absent_status is not None and status in ABSENT_STATUSES and status != absent_status:
                    targets.setdefault(absent_status, []).append(sandbox_id)
                    lost.append(sandbox_id)
            for status, ids in sorted(targets.items()):
                for chunk in _chunks(sorted(ids)):
                    changes: dict[str, Any] = {
                        "status": status,
                        "hibernation": None,
                        "hibernation_generation": None,
                        "hibernation_manifest_sha256": None,
                        "hibernated_at": None,
                    }
                    if status == HIBERNATED:  # it was not before: its image is on its host only
                        changes["hibernation"] = HIBERNATION_LOCAL
                        changes["hibernated_at"] = time.time()
                    where = [m.Sandbox.host == host, m.Sandbox.id.in_(chunk)]
                    if expected is not None:  # per row: the status it was read with (rows read above may be stale)
                        where.append(or_(*(and_(m.Sandbox.id == i, m.Sandbox.status == expected[i]) for i in chunk)))
                    s.execute(update(m.Sandbox).where(*where).values(changes))
            for chunk in _chunks(gone):
                s.execute(delete(m.Snapshot).where(m.Snapshot.id.in_(chunk), *_local_snapshots(host)))
        return HostReconcile(lost=sorted(lost), updated=sorted(updated), deleted_snapshots=gone)


# -- helpers ---------------------------------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise InvalidArgument("agent name must be 1-255 characters and not blank", details={"name": str(name)})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _agent(s: Session, name: str, *, lock: bool = False) -> m.Agent:
    obj = s.get(m.Agent, name, with_for_update=lock)
    if obj is None:
        raise NotFound(f"agent {name!r} not found", details={"agent": name})
    return obj


def _local_snapshots(host: str) -> tuple[Any, ...]:
    """WHERE clauses of the snapshot rows whose files only ``host`` holds."""
    return (m.Snapshot.host == host, m.Snapshot.location == "local")
