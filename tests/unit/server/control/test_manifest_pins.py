"""The manifest hash travels agent -> registry -> agent (in-process fake agents sharing one object store, a SQLite
registry): a drain pins each stored hibernation's manifest in its row and a wake elsewhere hands the pin to the
agent that imports it (a replaced manifest is refused and the sandbox stays where it was; an unpinned row from
before still wakes); a stored snapshot's row pins its manifest and a restore elsewhere carries it; a snapshot
registered by ``import`` is pinned as registered."""

from __future__ import annotations

import hashlib
import json

import pytest

from cryobox.errors import IntegrityError
from cryobox.server.control.createrequest import CreateRequest
from tests.support import registry as registry_support
from tests.support.control import Fleetish, made

registry = registry_support.sqlite_registry
clock = registry_support.clock
__all__ = ["clock", "made", "registry"]


def _stored_sha(c: Fleetish, sandbox_id: str) -> str:
    return hashlib.sha256(c.objects.get(f"hibernations/{sandbox_id}/manifest.json")).hexdigest()


def _edit_stored(c: Fleetish, sandbox_id: str) -> None:
    """What a store-side attacker can do to the fake's image: change a file of it (the manifest holds them)."""
    key = f"hibernations/{sandbox_id}/manifest.json"
    manifest = json.loads(c.objects.get(key))
    manifest["files"]["/root/file"] = "ZXZpbA=="  # "evil"
    c.objects.put(key, json.dumps(manifest).encode())


def _wakes(c: Fleetish, name: str) -> list[str | None]:
    return [args[0].manifest_sha256 for method, args in c.agents[name].calls if method == "wake_stored"]


async def test_a_drain_pins_each_manifest_and_the_wake_elsewhere_hands_the_pin_down(made: Fleetish) -> None:
    c = made
    rows = await c.three_on_a()
    await c.control.hibernations.drain("a")
    pins = {r.id: c.row(r.id).hibernation_manifest_sha256 for r in rows}
    assert pins == {r.id: _stored_sha(c, r.id) for r in rows}

    moved, agent = await c.exec(rows[0].id)
    assert agent is c.b and _wakes(c, "b") == [pins[rows[0].id]]
    assert (moved.hibernation, moved.hibernation_manifest_sha256) == (None, None)  # nothing stored any more


async def test_a_replaced_manifest_is_refused_and_the_sandbox_stays_where_it_was(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")
    pinned = c.row(row.id).hibernation_manifest_sha256
    c.a.sandboxes.pop(row.id)  # its host lost it: the stored image is the sandbox now
    _edit_stored(c, row.id)

    with pytest.raises(IntegrityError):
        await c.exec(row.id)
    after = c.row(row.id)
    assert (after.host, after.hibernation, after.hibernation_manifest_sha256) == ("a", "stored", pinned)
    assert row.id not in c.b.sandboxes and c.registry.fleet.reservations() == []
    assert _wakes(c, "b") == [pinned]


async def test_an_unpinned_stored_hibernation_from_before_still_wakes(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")
    c.registry.update_sandbox(row.id, hibernation_manifest_sha256=None)  # as revision 0007 leaves older rows
    c.a.sandboxes.pop(row.id)
    _edit_stored(c, row.id)  # nothing to check it against: trusted as fetched, as before

    moved, agent = await c.exec(row.id)
    assert agent is c.b and moved.host == "b" and _wakes(c, "b") == [None]
    assert await c.b.read_file(row.id, "/root/file") == b"evil"


async def test_an_image_stored_again_by_its_draining_host_is_pinned_again(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")
    first = c.row(row.id).hibernation_manifest_sha256
    c.a.files[row.id]["/root/file"] = b"changed since"  # its host holds a newer image than the stored one

    moved, agent = await c.exec(row.id)  # the draining host stores it again first: the new manifest is pinned
    [pin] = _wakes(c, "b")
    assert agent is c.b and pin not in (None, first)
    assert await c.b.read_file(row.id, "/root/file") == b"changed since"


async def test_a_stored_snapshot_is_pinned_and_restored_elsewhere_only_with_its_pin(made: Fleetish) -> None:
    c = made
    c.b.stored, c.b.stored_manifests = c.a.stored, c.a.stored_manifests  # one object store for both
    [parent, *_] = await c.three_on_a()
    snap = await c.control.snapshots.take(parent.id, c.ws, labels={}, retain=False, quiesce=False)
    await c.control.snapshots.wait_stored(snap.id)
    row = c.registry.get_snapshot(snap.id)
    assert row.location == "stored" and row.manifest_sha256 == c.a.stored_manifests[snap.id]

    c.a.memory_mib, c.b.memory_mib = 1024, 1 << 20  # b now outscores a, files or not
    await c.beat()
    request = CreateRequest(
        template="base", workspace_id=c.ws, metadata={}, env={}, ttl_s=None, persistent=False, from_snapshot=snap.id
    )
    child = await c.control.create(request)
    [spec] = [args[0] for method, args in c.b.calls if method == "create"]
    assert child.host == "b" and spec.from_snapshot is not None
    assert (spec.from_snapshot.stored, spec.from_snapshot.manifest_sha256) == (True, row.manifest_sha256)

    c.registry.update_snapshot(snap.id, manifest_sha256="0" * 64)  # the store's manifest is not the pinned one
    with pytest.raises(IntegrityError):
        await c.control.create(request)
    assert [r.id for r in c.registry.list_sandboxes(host="b")] == [child.id]


async def test_an_imported_snapshot_is_pinned_as_registered(made: Fleetish) -> None:
    c = made
    data = json.dumps({"id": "snap-x", "template": "base", "template_generation": "g1", "size_bytes": 3}).encode()
    c.objects.put("snapshots/snap-x/manifest.json", data)
    row = await c.control.snapshots.import_published("snap-x", c.ws, labels={}, retain=False)
    assert row.manifest_sha256 == hashlib.sha256(data).hexdigest() == c.registry.get_snapshot("snap-x").manifest_sha256


async def test_a_wake_at_home_forgets_the_pin_of_the_stored_image(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")
    await c.control.hibernations.undrain("a")
    woken, agent = await c.exec(row.id)  # its host is up and holds it: it wakes there
    assert agent is c.a and _wakes(c, "b") == []
    for seen in (woken, c.row(row.id)):
        assert (seen.status, seen.hibernation, seen.hibernation_manifest_sha256) == ("running", None, None)
