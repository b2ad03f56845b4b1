"""Agent loads for placement: committed sandboxes and reservations per agent, read in one statement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session

from . import models as m
from .rows import ACTIVE_STATUSES, AgentLoad, AgentRow, _from_orm


def _loads_statement() -> Select[str, Any, Any, Any, Any, Any, Any]:
    """Per agent named in ``:names``: its active sandboxes' memory, cpus and count, and its reservations' unexpired
    at ``:now``. Built once (:data:`LOADS`): building it took half of a reservation's time (~0.9 of 1.7 ms)."""
    committed = (
        select(
            m.Sandbox.host.label("host"),
            func.sum(m.Sandbox.memory_mib).label("memory"),
            func.sum(m.Sandbox.cpus).label("cpus"),
            func.count().label("n"),
        )
        .where(m.Sandbox.status.in_(ACTIVE_STATUSES))
        .group_by(m.Sandbox.host)
        .subquery()
    )
    reserved = (
        select(
            m.Reservation.agent.label("agent"),
            func.sum(m.Reservation.memory_mib).label("memory"),
            func.sum(m.Reservation.cpus).label("cpus"),
            func.count().label("n"),
        )
        .where(m.Reservation.expires_at > bindparam("now"))
        .group_by(m.Reservation.agent)
        .subquery()
    )
    return (
        select(
            m.Agent.name,
            func.coalesce(committed.c.memory, 0),
            func.coalesce(committed.c.cpus, 0),
            func.coalesce(committed.c.n, 0),
            func.coalesce(reserved.c.memory, 0),
            func.coalesce(reserved.c.cpus, 0),
            func.coalesce(reserved.c.n, 0),
        )
        .select_from(m.Agent)
        .outerjoin(committed, committed.c.host == m.Agent.name)
        .outerjoin(reserved, reserved.c.agent == m.Agent.name)
        .where(m.Agent.name.in_(bindparam("names", expanding=True)))
    )


LOADS = _loads_statement()


def agent_loads(s: Session, agents: Sequence[m.Agent], now: float) -> list[AgentLoad]:
    """The load of each agent, from ONE statement (one snapshot: a concurrent commit is counted once, not 0 or 2)."""
    if not agents:
        return []
    rows = s.execute(LOADS, {"now": float(now), "names": [a.name for a in agents]})
    sums: dict[str, tuple[int, ...]] = {str(row[0]): tuple(int(v) for v in row[1:]) for row in rows}
    loads = []
    for obj in agents:
        c_mem, c_cpus, c_n, r_mem, r_cpus, r_n = sums.get(obj.name, (0, 0, 0, 0, 0, 0))
        loads.append(
            AgentLoad(
                agent=_from_orm(obj, AgentRow),
                committed_memory_mib=c_mem,
                committed_cpus=c_cpus,
                sandboxes=c_n,
                reserved_memory_mib=r_mem,
                reserved_cpus=r_cpus,
                reservations=r_n,
            )
        )
    return loads


def free_memory(load: AgentLoad) -> int | None:
    total = load.agent.capacity.get("memory_total_mib")
    if not isinstance(total, int) or isinstance(total, bool):
        return None
    pooled = load.agent.capacity.get("memory_pooled_mib", 0)
    return total - load.used_memory_mib - (pooled if isinstance(pooled, int) else 0)
