"""Volumes moving between hosts through the object store, in the control plane over fake agents ``a`` and ``b``
(one object store) on a real (SQLite) registry: a draining host's volume moves to where the create goes (stored,
claimed, fetched, then the row names the target and the source's copy goes); two replicas never both move it
(the lease); an attached volume does not move; a lost host's volume is ``lost`` (409) until restored from its last
stored copy, which says what may be lost."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from cryobox.agentapi.models_volumes import StoredVolume
from cryobox.errors import HostUnavailable, StateError
from cryobox.registry import Registry
from cryobox.registry.volumes import VolumeRecords, VolumeRow
from cryobox.server.control.createrequest import CreateRequest
from cryobox.server.control.volumemoves import LEASE_STALE_S
from cryobox.server.control.volumes import MountRequest
from tests.support import registry as registry_support
from tests.support.clock import T0, FakeClock
from tests.support.control import DEADLINE_S, Fleetish, made

__all__ = ["made"]  # fixtures
registry = registry_support.sqlite_registry
clock = registry_support.clock


async def volume_on_a(c: Fleetish, name: str = "data") -> VolumeRow:
    state = await c.control.volumes.create(c.ws, name, 64 << 20)
    assert state.row.host == "a"
    return state.row


def request(c: Fleetish, name: str = "data", read_only: bool = False) -> CreateRequest:
    return CreateRequest(
        template="base",
        workspace_id=c.ws,
        metadata={},
        env={},
        ttl_s=600,
        persistent=False,
        volumes=(MountRequest(name, f"/mnt/{name}", read_only),),
    )


async def test_a_draining_hosts_volume_moves_to_the_host_the_create_goes_to(made: Fleetish) -> None:
    c = made
    vol = await volume_on_a(c)
    await c.control.hibernations.drain("a")

    row = await c.control.create(request(c))

    assert row.host == "b"
    moved = c.control.volumes.records.by_id(vol.id)
    assert (moved.host, moved.move_target, [a.sandbox_id for a in moved.attachments]) == ("b", None, [row.id])
    assert c.a.call_names().count("store_volume") == 1 and vol.id not in c.a.volumes  # the source's copy went
    fetched = [args[0] for name, args in c.b.calls if name == "fetch_volume"]
    assert [f.manifest_sha256 for f in fetched] == [moved.stored_sha256] and vol.id in c.b.volumes
    owner = c.control.volumes.owners
    assert owner is not None and c.objects.exists(f"owners/{owner.record.id}/volumes/{vol.id}")  # claimed


async def test_an_attached_volume_on_a_draining_host_does_not_move(made: Fleetish) -> None:
    c = made
    vol = await volume_on_a(c)
    first = await c.control.create(request(c, read_only=True))
    assert first.host == "a"
    await c.control.hibernations.drain("a")
    with pytest.raises(StateError) as refused:
        await c.control.create(request(c, read_only=True))
    assert refused.value.details.get("attached_to") == [first.id]
    assert c.control.volumes.records.by_id(vol.id).host == "a" and "fetch_volume" not in c.b.call_names()
    assert c.a.call_names().count("store_volume") == 1  # the drain's, once its reader hibernated; no move


async def test_two_replicas_never_both_move_a_volume(made: Fleetish, monkeypatch: pytest.MonkeyPatch) -> None:
    c = made
    vol = await volume_on_a(c)
    await c.control.hibernations.drain("a")
    store = c.a.store_volume
    stored_once = asyncio.Event()

    async def slow_store(volume_id: str) -> StoredVolume:
        done = await store(volume_id)
        stored_once.set()
        await asyncio.sleep(0.05)
        return done

    monkeypatch.setattr(c.a, "store_volume", slow_store)
    other = c.replica()
    results = await asyncio.gather(
        c.control.create(request(c)), other.create(request(c, read_only=True)), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], StateError) and errors[0].state == "moving", results
    assert c.a.call_names().count("store_volume") == 1 and c.b.call_names().count("fetch_volume") == 1
    assert c.control.volumes.records.by_id(vol.id).host == "b"


def test_the_lease_is_one_holders_and_a_stale_one_is_taken_over(registry: Registry, clock: FakeClock) -> None:

    records = VolumeRecords(registry.database)
    ws = registry.ensure_workspace("w").id
    row = records.add(VolumeRow("vol-0000000000aa", ws, "v", 64 << 20, "a", T0))
    first = records.begin_move(row.id, "a", "b", T0, LEASE_STALE_S)
    with pytest.raises(StateError, match="moving"):
        records.begin_move(row.id, "a", "c", T0 + 1, LEASE_STALE_S)
    with pytest.raises(StateError, match="moving"):  # no attachment while it moves
        records.attach(row.id, "sb-1", "/mnt/v", read_only=True)
    second = records.begin_move(row.id, "a", "c", T0 + LEASE_STALE_S + 1, LEASE_STALE_S)  # its replica died
    with pytest.raises(StateError, match="moving"):
        records.finish_move(row.id, first, "b")  # the first holder lost it: nothing written
    assert records.by_id(row.id).host == "a"
    assert records.finish_move(row.id, second, "c").host == "c"
    with pytest.raises(StateError, match="now, not a"):
        records.begin_move(row.id, "a", "b", T0 + LEASE_STALE_S + 2, LEASE_STALE_S)
    records.attach(row.id, "sb-1", "/mnt/v", read_only=True)
    with pytest.raises(StateError, match="attached"):
        records.begin_move(row.id, "c", "b", T0 + LEASE_STALE_S + 3, LEASE_STALE_S)


async def test_a_lost_hosts_volume_is_lost_until_restored_from_its_last_stored_copy(
    made: Fleetish, clock: FakeClock
) -> None:
    c = made
    vol = await volume_on_a(c)
    writer = await c.control.create(request(c))
    assert writer.host == "a"
    await c.a.delete(writer.id)
    await c.control.volumes.sandbox_gone(writer.id)  # detached, then stored (as a drain's last detach would)
    stored = await c.control.volumes.mover.store(c.control.volumes.records.by_id(vol.id))
    assert stored.stored_sha256 is not None and stored.host == "a"
    again = await c.control.create(request(c))  # written again after the store: those writes are at risk

    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")
    assert await c.control.fleet.check_stale() == ["a"]
    state = await c.control.volumes.get(c.ws, "data")
    assert state.status == "lost"
    with pytest.raises(StateError) as refused:
        await c.control.create(request(c, read_only=True))
    assert refused.value.state == "lost" and "restore" in refused.value.message

    restored = await c.control.volumes.restore(c.ws, "data")

    assert (restored.row.host, restored.lost_host, restored.stored_at) == ("b", "a", stored.stored_at)
    assert restored.row.attachments == () and restored.row.writer is None  # the lost sandbox's attachment went
    assert vol.id in c.b.volumes and again.host == "a"
    with pytest.raises(StateError, match="not lost"):
        await c.control.volumes.restore(c.ws, "data")
    assert (await c.control.volumes.get(c.ws, "data")).status == "ready"


async def test_a_never_stored_lost_volume_cannot_be_restored(made: Fleetish, clock: FakeClock) -> None:
    c = made
    vol = await volume_on_a(c)
    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")
    await c.control.fleet.check_stale()
    with pytest.raises(StateError, match="never stored"):
        await c.control.volumes.restore(c.ws, "data")
    assert c.control.volumes.records.by_id(vol.id) == replace(vol)  # nothing written
    await c.beat("a")  # the host comes back: so does the volume, with every write
    assert (await c.control.volumes.get(c.ws, "data")).status == "ready"


async def drained_writer(c: Fleetish) -> tuple[VolumeRow, str]:
    """A volume on ``a`` written by a sandbox on ``a``; then ``a`` is drained (no errors)."""
    vol = await volume_on_a(c)
    writer = await c.control.create(request(c))
    assert writer.host == "a" and c.a.held[writer.id] == [vol.id]
    report = await c.control.hibernations.drain("a")
    assert report.errors == [] and [d.id for d in report.drained] == [writer.id]
    return vol, writer.id


async def test_a_drain_stores_a_sandboxs_volumes_and_they_follow_it_to_where_it_wakes(made: Fleetish) -> None:
    c = made
    vol, sandbox_id = await drained_writer(c)
    names = c.a.call_names()
    assert names.index("store_volume") > names.index("store_hibernation")  # stored once the guest hibernated
    drained = c.control.volumes.records.by_id(vol.id)
    assert drained.host == "a" and drained.stored_sha256 is not None  # a copy the wake can use if a is gone
    assert [a.sandbox_id for a in drained.attachments] == [sandbox_id]

    moved, agent = await c.exec(sandbox_id)

    assert agent is c.b and moved.host == "b" and c.b.held[sandbox_id] == [vol.id]  # woke with its volume
    row = c.control.volumes.records.by_id(vol.id)
    assert (row.host, row.move_target, [a.sandbox_id for a in row.attachments]) == ("b", None, [sandbox_id])
    assert row.writer == sandbox_id  # still its read-write holder
    b_names = c.b.call_names()
    assert b_names.index("fetch_volume") < b_names.index("wake_stored")  # the volume was there first
    assert vol.id not in c.a.volumes and sandbox_id not in c.a.sandboxes  # the old host's copies went


async def test_a_drained_sandbox_wakes_with_the_drains_copy_of_its_volume_when_its_host_is_gone(
    made: Fleetish, clock: FakeClock
) -> None:
    c = made
    vol, sandbox_id = await drained_writer(c)
    pinned = c.control.volumes.records.by_id(vol.id).stored_sha256
    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")
    assert await c.control.fleet.check_stale() == ["a"]

    moved, agent = await c.exec(sandbox_id)

    assert agent is c.b and moved.host == "b" and c.b.held[sandbox_id] == [vol.id]
    assert c.a.call_names().count("store_volume") == 1  # only the drain's: a is gone
    fetched = [args[0] for name, args in c.b.calls if name == "fetch_volume"]
    assert [f.manifest_sha256 for f in fetched] == [pinned]
    assert c.control.volumes.records.by_id(vol.id).host == "b"


async def test_readers_drained_together_take_their_volume_along_and_wake_on_one_host(made: Fleetish) -> None:
    c = made
    vol = await volume_on_a(c)
    first = await c.control.create(request(c, read_only=True))
    second = await c.control.create(request(c, read_only=True))
    assert first.host == second.host == "a"
    report = await c.control.hibernations.drain("a")
    assert report.errors == []  # the volume is stored with the last of its readers to drain

    woken, _ = await c.exec(first.id)

    assert woken.host == "b" and c.control.volumes.records.by_id(vol.id).host == "b"
    await c.control.hibernations.undrain("a")  # a takes sandboxes again and has far more room than b: the
    c.a.memory_mib = 1 << 20  # second reader still goes where the volume is, not home nor to the roomier host
    await c.beat()
    later, _ = await c.exec(second.id)
    assert later.host == "b" and c.b.held[second.id] == [vol.id] and c.b.held[first.id] == [vol.id]
    row = c.control.volumes.records.by_id(vol.id)
    assert sorted(a.sandbox_id for a in row.attachments) == sorted([first.id, second.id])


def test_a_lease_for_following_sandboxes_is_refused_while_another_holds_the_volume(
    registry: Registry, clock: FakeClock
) -> None:

    records = VolumeRecords(registry.database)
    ws = registry.ensure_workspace("w").id
    row = records.add(VolumeRow("vol-0000000000ab", ws, "v", 64 << 20, "a", T0))
    records.attach(row.id, "sb-1", "/mnt/v", read_only=True)
    records.attach(row.id, "sb-2", "/mnt/v", read_only=True)
    with pytest.raises(StateError) as refused:
        records.begin_move(row.id, "a", "b", T0, LEASE_STALE_S, holders={"sb-1"})
    assert refused.value.details["attached_to"] == ["sb-1", "sb-2"] and records.by_id(row.id).move_target is None
    assert records.begin_move(row.id, "a", "b", T0, LEASE_STALE_S, holders={"sb-1", "sb-2"})


async def test_a_returning_host_forgets_its_stale_copy_of_a_restored_volume_and_of_a_deleted_one(
    made: Fleetish, clock: FakeClock
) -> None:
    c = made
    restored = await volume_on_a(c, "restored")
    await c.control.volumes.mover.store(restored)
    kept = await c.control.volumes.create(c.ws, "kept", 64 << 20)  # b: the host holding fewer
    gone = await volume_on_a(c, "gone")
    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")
    assert await c.control.fleet.check_stale() == ["a"]
    await c.control.volumes.restore(c.ws, "restored")  # now on b; a's copy holds what the restore gave up
    c.control.volumes.records.delete(gone.id)  # deleted while a was away (its image stays there)
    assert kept.row.host == "b"
    c.a.volumes["vol-elsewhere"] = 64 << 20  # a stray no row names at all
    assert {restored.id, gone.id} <= set(c.a.volumes)

    await c.beat("a")  # a registers again

    assert set(c.a.volumes) == set() and restored.id in c.b.volumes and kept.row.id in c.b.volumes
    assert c.control.volumes.records.by_id(restored.id).host == "b"


async def test_a_registering_host_keeps_the_copy_a_move_is_fetching_there(made: Fleetish) -> None:
    c = made
    vol = await volume_on_a(c)
    c.control.volumes.records.begin_move(vol.id, "a", "b", T0, LEASE_STALE_S)
    c.b.volumes[vol.id] = 64 << 20  # the fetch under way

    assert await c.control.volumes.mover.forget_strays("b") == []
    assert await c.control.volumes.mover.forget_strays("a") == []
    assert vol.id in c.b.volumes and vol.id in c.a.volumes


async def test_a_create_whose_volumes_host_is_full_moves_them_to_a_host_with_room(made: Fleetish) -> None:
    c = made
    vol = await volume_on_a(c)
    c.a.memory_mib = 256  # a is up but has no room for a 512 MiB sandbox
    await c.beat("a")

    row = await c.control.create(request(c))

    assert row.host == "b" and c.b.held[row.id] == [vol.id]
    moved = c.control.volumes.records.by_id(vol.id)
    assert (moved.host, moved.move_target, [a.sandbox_id for a in moved.attachments]) == ("b", None, [row.id])
    assert vol.id not in c.a.volumes and c.registry.fleet.reservations() == []


async def test_a_full_hosts_volume_another_sandbox_reads_stays_and_the_create_is_the_503(made: Fleetish) -> None:
    c = made
    vol = await volume_on_a(c)
    reader = await c.control.create(request(c, read_only=True))
    assert reader.host == "a"
    c.a.memory_mib = 600  # room for the reader only
    await c.beat("a")

    with pytest.raises(HostUnavailable) as refused:
        await c.control.create(request(c, read_only=True))

    assert refused.value.retry_after_s is not None
    row = c.control.volumes.records.by_id(vol.id)
    assert (row.host, [a.sandbox_id for a in row.attachments]) == ("a", [reader.id])  # nothing changed
    assert "fetch_volume" not in c.b.call_names() and c.registry.fleet.reservations() == []
    assert len(c.registry.list_sandboxes()) == 1
