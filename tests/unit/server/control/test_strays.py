"""Sandboxes an agent reports that nobody recorded (no row, no unexpired reservation) are found, and deleted on
their agent; one still settling (its reservation names it) or recorded is left alone."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from cryobox.agentapi import models as am
from cryobox.registry import Registry
from cryobox.registry.strays import unknown_sandboxes
from cryobox.server.control.strays import delete_strays
from tests.support import registry as registry_support
from tests.support.registry import sandbox

pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry


def _setup(reg: Registry) -> None:
    ws = reg.ensure_workspace("default")
    reg.fleet.heartbeat(
        "a", url="http://a.invalid", boot_id="b1", capacity={"memory_total_mib": 8192}, info={}, now=100.0
    )
    reg.add_sandbox(sandbox("sb-row", ws.id, host="a", status="running"))
    reg.fleet.reserve(
        memory_mib=512,
        cpus=1,
        now=100.0,
        ttl_s=30.0,
        choose=lambda loads: "a",
        live_after=0.0,
        sandbox_id="sb-settling",
    )


def test_unknown_sandboxes_have_no_row_and_no_live_reservation(registry: Registry) -> None:
    _setup(registry)
    reported = ["sb-row", "sb-settling", "sb-stray"]
    assert unknown_sandboxes(registry.database, reported, now=110.0) == ["sb-stray"]
    # the reservation of a control plane that died expires: then its sandbox is a stray too
    assert unknown_sandboxes(registry.database, reported, now=131.0) == ["sb-settling", "sb-stray"]
    assert unknown_sandboxes(registry.database, [], now=131.0) == []
    # taken over by a restarted agent: the process that was making it is dead, only a row counts
    assert unknown_sandboxes(registry.database, reported, now=110.0, adopted=["sb-settling"]) == [
        "sb-settling",
        "sb-stray",
    ]


class RecordingAgent:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete(self, sandbox_id: str) -> None:
        self.deleted.append(sandbox_id)


def _info(sandbox_id: str) -> am.SandboxInfo:
    return am.SandboxInfo(
        id=sandbox_id, template="base", cpus=1, memory_mib=512, state="running", workspace_id="w", created_at=1.0
    )


async def test_delete_strays_deletes_only_unknown_ones(registry: Registry) -> None:
    _setup(registry)
    agent = RecordingAgent()
    reported = [_info(i) for i in ("sb-row", "sb-settling", "sb-stray")]
    assert await delete_strays(registry, "a", agent, reported, now=110.0) == ["sb-stray"]  # type: ignore[arg-type]
    assert agent.deleted == ["sb-stray"]
    assert registry.get_sandbox("sb-row").status == "running"


def test_a_create_committing_between_the_two_reads_is_not_a_stray(registry: Registry) -> None:
    """A create commits its row and deletes its reservation in one transaction; on PostgreSQL each statement has a
    snapshot of its own, so that commit can land between the two reads of :func:`unknown_sandboxes`. Whichever
    read it lands after, the sandbox is known (it was once deleted as a stray right after its create)."""
    _setup(registry)
    (reservation_id,) = [r.id for r in registry.fleet.reservations() if r.sandbox_id == "sb-settling"]
    ws = registry.ensure_workspace("default")
    fired: list[str] = []

    def commit_after_first_read(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not fired and statement.lstrip().upper().startswith("SELECT"):
            fired.append(statement)
            registry.fleet.commit(reservation_id, sandbox("sb-settling", ws.id, host="a", status="running"))

    event.listen(registry.database.engine, "after_cursor_execute", commit_after_first_read)
    try:
        assert unknown_sandboxes(registry.database, ["sb-settling", "sb-stray"], now=110.0) == ["sb-stray"]
    finally:
        event.remove(registry.database.engine, "after_cursor_execute", commit_after_first_read)
    assert fired, "the commit was never injected"
    assert registry.get_sandbox("sb-settling").status == "running"
