"""The control plane claims in the object store what it has agents store, and releases it when it deletes it (a
SQLite registry, fake agents sharing one store): a store GC consulting the registry keeps what the registry lists
and deletes what it has forgotten (:mod:`cryobox.objstore.owners`)."""

from __future__ import annotations

import json

from cryobox.objstore.gc import GcPolicy, collect
from cryobox.objstore.owners import claim_key, record_key
from cryobox.registry.oracle import RegistryOracle, machine_id
from tests.support import registry as registry_support
from tests.support.control import Fleetish, made
from tests.support.storegc import HOUR, hours_later

registry = registry_support.sqlite_registry
clock = registry_support.clock
__all__ = ["clock", "made", "registry"]


def claims(c: Fleetish) -> set[str]:
    rid = c.registry.identity()
    return {k.removeprefix(f"owners/{rid}/") for k in c.objects.list(f"owners/{rid}/")}


async def test_snapshots_are_claimed_before_they_are_stored_and_released_when_deleted(made: Fleetish) -> None:
    c = made
    assert c.objects.list("owners") == [record_key(c.registry.identity())]  # announced at start
    record = json.loads(c.objects.get(record_key(c.registry.identity())))
    assert record["kind"] == "sqlite" and record["machine"] == machine_id()
    [parent, *_] = await c.three_on_a()
    snap = await c.control.snapshots.take(parent.id, c.ws, labels={}, retain=False, quiesce=False)
    await c.control.snapshots.wait_stored(snap.id)
    assert claims(c) == {f"snapshots/{snap.id}"}
    await c.control.snapshots.delete(snap.id, c.ws)
    assert claims(c) == set()

    data = json.dumps({"id": "snap-x", "template": "base", "template_generation": "g1", "size_bytes": 3}).encode()
    c.objects.put("snapshots/snap-x/manifest.json", data)  # another installation's, imported here: claimed too
    await c.control.snapshots.import_published("snap-x", c.ws, labels={}, retain=False)
    assert claims(c) == {"snapshots/snap-x"}


async def test_a_gc_keeps_the_hibernations_the_registry_lists_and_deletes_the_forgotten(made: Fleetish) -> None:
    c = made
    rows = await c.three_on_a()
    await c.control.hibernations.drain("a")
    assert claims(c) == {f"hibernations/{r.id}" for r in rows}
    oracle = RegistryOracle(machine_id())
    later = hours_later(2)

    collect(c.objects, GcPolicy(grace_s=HOUR), later, oracle)
    assert {k.split("/")[1] for k in c.stored_keys()} == {r.id for r in rows}, "listed: kept"

    c.registry.delete_sandbox(rows[0].id)  # a row that went while its stored image stayed (a crash between)
    report = collect(c.objects, GcPolicy(grace_s=HOUR), later, oracle)
    assert {k.split("/")[1] for k in c.stored_keys()} == {r.id for r in rows[1:]}
    assert claims(c) == {f"hibernations/{r.id}" for r in rows[1:]}
    assert {r.group for r in report.removed if r.kind == "disowned"} == {f"hibernations/{rows[0].id}"}

    moved, _ = await c.exec(rows[1].id)  # woken elsewhere: the stored copy and its claim go
    assert moved.host == "b" and claim_key(c.registry.identity(), f"hibernations/{rows[1].id}") not in set(
        c.objects.list("owners")
    )
