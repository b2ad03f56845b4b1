"""Volume rows and attachments on both backends: names unique per workspace, one writer or any number of readers
(whatever replica asks), no delete while attached, a sandbox's attachments dropped at once."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from cryobox.errors import InvalidArgument, NotFound, StateError
from cryobox.registry import Registry
from cryobox.registry.volumes import VolumeRecords, VolumeRow
from tests.support import registry as registry_support

# the shared fixtures, bound here under the names the tests ask for
pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry


def volume(ws: str, name: str, vid: str) -> VolumeRow:
    return VolumeRow(id=vid, workspace_id=ws, name=name, size_bytes=1 << 30, host="h1", created_at=1.0)


def test_one_writer_many_readers_and_no_delete_while_attached(registry: Registry) -> None:
    ws = registry.ensure_workspace("w").id
    other = registry.ensure_workspace("o").id
    records = VolumeRecords(registry.database)
    records.add(volume(ws, "data", "vol-000000000001"))
    records.add(volume(other, "data", "vol-000000000002"))  # the same name in another workspace
    with pytest.raises(InvalidArgument):
        records.add(volume(ws, "data", "vol-000000000003"))
    with pytest.raises(NotFound):
        records.get(other, "missing")
    assert records.get(other, "data").id == "vol-000000000002"

    records.attach("vol-000000000001", "sb-a", "/data", read_only=False)
    with pytest.raises(StateError) as info:
        records.attach("vol-000000000001", "sb-b", "/data", read_only=False)
    assert info.value.details["writer"] == "sb-a"
    with pytest.raises(StateError):  # no reader while it is written
        records.attach("vol-000000000001", "sb-c", "/ro", read_only=True)
    row = records.get(ws, "data")
    assert row.writer == "sb-a" and [a.sandbox_id for a in row.attachments] == ["sb-a"]  # the refused wrote nothing
    with pytest.raises(StateError):
        records.delete("vol-000000000001")

    assert records.detach_sandbox("sb-a") == ["vol-000000000001"]
    assert records.get(ws, "data").writer is None
    records.attach("vol-000000000001", "sb-c", "/ro", read_only=True)
    records.attach("vol-000000000001", "sb-d", "/ro", read_only=True)  # any number of readers
    with pytest.raises(StateError) as info:  # no writer while it is read
        records.attach("vol-000000000001", "sb-b", "/data", read_only=False)
    assert (info.value.details["writer"], info.value.details["readers"]) == (None, ["sb-c", "sb-d"])
    assert [a.sandbox_id for a in records.get(ws, "data").attachments] == ["sb-c", "sb-d"]
    for sandbox in ("sb-c", "sb-d"):
        records.detach_sandbox(sandbox)
    records.attach("vol-000000000001", "sb-b", "/data", read_only=False)  # free again
    records.detach_sandbox("sb-b")
    assert records.detach_sandbox("sb-b") == []  # idempotent
    records.delete("vol-000000000001")
    assert [v.name for v in records.list_volumes()] == ["data"] and records.usage(ws) == (0, 0)
    assert records.usage(other) == (1, 1 << 30)


def test_attach_by_name_only_where_its_host_is_alive(registry: Registry) -> None:
    ws = registry.ensure_workspace("w").id
    records = VolumeRecords(registry.database)
    records.add(volume(ws, "data", "vol-000000000001"))
    with pytest.raises(NotFound):
        records.attach_named(ws, "missing", "sb-a", "/data", read_only=False, alive_after=0.0)
    assert records.attach_named(ws, "data", "sb-a", "/data", read_only=False, alive_after=0.0) is None  # no agent h1
    registry.fleet.heartbeat("h1", url="http://h1", boot_id="b1", capacity={}, info={}, now=42.0)
    assert records.attach_named(ws, "data", "sb-a", "/data", read_only=False, alive_after=50.0) is None  # silent
    assert records.get(ws, "data").attachments == ()  # nothing written when it is not attached
    row = records.attach_named(ws, "data", "sb-a", "/data", read_only=False, alive_after=40.0)
    assert row is not None and (row.writer, [a.sandbox_id for a in row.attachments]) == ("sb-a", ["sb-a"])
    with pytest.raises(StateError) as info:
        records.attach_named(ws, "data", "sb-b", "/data", read_only=False, alive_after=40.0)
    assert info.value.details["writer"] == "sb-a"
    records.detach_sandbox("sb-a")
    row = records.attach_named(ws, "data", "sb-c", "/ro", read_only=True, alive_after=40.0)
    assert row is not None and (row.writer, [(a.sandbox_id, a.read_only) for a in row.attachments]) == (
        None,
        [("sb-c", True)],
    )


ROUNDS = 5
RACERS = 6


def test_racing_replicas_take_a_volumes_move_lease_once_and_never_beside_an_attachment(registry: Registry) -> None:
    """Replicas race (threads, each its own session: PostgreSQL's ``FOR UPDATE`` row lock, SQLite's write lock):
    of several leases asked at once exactly one is granted, and a lease and an attachment asked at once never
    both succeed."""
    records = VolumeRecords(registry.database)
    ws = registry.ensure_workspace("w").id

    def race(calls: list[Callable[[], object]]) -> list[object]:
        barrier = threading.Barrier(len(calls))

        def run(call: Callable[[], object]) -> object:
            barrier.wait()
            try:
                return call()
            except StateError as err:
                return err

        with ThreadPoolExecutor(len(calls)) as pool:
            return list(pool.map(run, calls))

    for n in range(ROUNDS):
        row = records.add(volume(ws, f"race{n}", f"vol-{n:012x}"))
        leases = race([functools.partial(records.begin_move, row.id, "h1", f"t{i}", 1.0, 900.0) for i in range(RACERS)])
        won = [r for r in leases if isinstance(r, str)]
        assert len(won) == 1 and all(isinstance(r, StateError) and r.state == "moving" for r in leases if r not in won)
        assert records.by_id(row.id).move_target == f"t{leases.index(won[0])}"
        records.abort_move(row.id, won[0])

        lease, attach = race(
            [
                functools.partial(records.begin_move, row.id, "h1", "b", 2.0, 900.0),
                functools.partial(records.attach, row.id, f"sb-{n}", "/mnt/v", read_only=False),
            ]
        )
        assert isinstance(lease, StateError) != isinstance(attach, StateError), (lease, attach)  # one of the two
        after = records.by_id(row.id)
        if isinstance(lease, str):
            assert isinstance(attach, StateError) and attach.state == "moving"
            assert after.attachments == () and after.move_target == "b"
        else:
            assert isinstance(lease, StateError) and lease.state == "attached"
            assert after.move_target is None and after.writer == f"sb-{n}"
