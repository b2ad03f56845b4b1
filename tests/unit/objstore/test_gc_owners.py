"""A store GC with registries to consult (``owners/``): what a registry that is gone, or no longer lists an image,
had stored goes; what a registry lists, cannot be judged, or nobody claimed stays (a real file:// store; the
registries are an oracle here, the real ones are tested in ``tests/unit/registry/test_oracle.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cryobox.objstore import owners
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.gc import GcPolicy, collect
from cryobox.objstore.owners import Listing, RegistryRecord
from tests.support.storegc import HOUR, age, hours_later, live_problems, put_generation, put_image, referenced


@dataclass
class Oracle:
    listings: dict[str, Listing]
    consulted: list[str] = field(default_factory=list)

    def consult(self, record: RegistryRecord) -> Listing:
        self.consulted.append(record.id)
        return self.listings.get(record.id, owners.UNKNOWN)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def registry(store: ObjectStore, rid: str, *claimed: str) -> None:
    owners.announce(store, RegistryRecord(rid, "sqlite", f"/data/{rid}/registry.sqlite", "m1"))
    for prefix in claimed:
        owners.claim(store, rid, prefix)


def image(store: ObjectStore, work: Path, prefix: str) -> None:
    put_image(store, work, prefix, {0: b"kernel", 1: f"own page of {prefix}".encode()}, {"template": "base"})


def groups(store: ObjectStore) -> set[str]:
    return {"/".join(k.split("/")[:2]) for k in store.list("") if k.startswith(("snapshots/", "hibernations/"))}


def test_what_a_gone_or_forgetting_registry_stored_goes_and_everything_else_stays(
    store: ObjectStore, tmp_path: Path
) -> None:
    put_generation(store, tmp_path, "g1", {0: b"kernel"}, 0.0, latest=True)
    kept = ["snapshots/s1", "hibernations/sb1", "snapshots/young", "snapshots/c1", "snapshots/u1", "snapshots/both"]
    gone = ["snapshots/s2", "snapshots/b1", "hibernations/sb2"]
    for prefix in kept + gone:
        image(store, tmp_path, prefix)
    registry(store, "live", "snapshots/s1", "hibernations/sb1", "snapshots/s2", "snapshots/young", "snapshots/both")
    registry(store, "gone", "snapshots/b1", "hibernations/sb2", "snapshots/both")
    registry(store, "elsewhere", "snapshots/c1")  # another machine's, or a PostgreSQL this run was not given
    owners.claim(store, "live", "snapshots/deleted-long-ago")  # a claim whose image went by other means
    age(store, owners.claim_key("live", "snapshots/young"), -2 * HOUR)  # claimed "now": a row on its way?
    oracle = Oracle(
        {
            "live": Listing("live", frozenset({"s1", "both"}), frozenset({"sb1"})),
            "gone": Listing("gone"),
        }
    )

    report = collect(store, GcPolicy(grace_s=HOUR), hours_later(2), oracle)

    assert sorted(oracle.consulted) == ["elsewhere", "gone", "live"]  # once per registry, not per claim
    assert groups(store) == set(kept)
    assert live_problems(store) == []
    assert set(store.list("chunks")) == referenced(store), "the disowned images' own chunks went with them"
    left = set(store.list(owners.OWNERS))
    assert left == {
        owners.record_key("live"),
        owners.record_key("gone"),  # it still claims an image that stays
        owners.record_key("elsewhere"),
        *(owners.claim_key("live", p) for p in ("snapshots/s1", "hibernations/sb1", "snapshots/young")),
        owners.claim_key("live", "snapshots/both"),
        owners.claim_key("gone", "snapshots/both"),  # its image stays (the live registry lists it): so does this
        owners.claim_key("elsewhere", "snapshots/c1"),
    }, "claims of deleted images, and the gone registry's record, went"
    kinds = report.by_kind()
    assert kinds["disowned"][0] == 3 * 3  # each image's manifest, memory index and vmstate (chunks: "chunk")
    assert [r.key for r in report.removed if r.kind == "disowned"][0].endswith("/manifest.json")


def test_a_dry_run_names_the_disowned_images_and_deletes_nothing(store: ObjectStore, tmp_path: Path) -> None:
    image(store, tmp_path, "snapshots/b1")
    registry(store, "gone", "snapshots/b1")
    before = sorted(store.list(""))
    report = collect(store, GcPolicy(grace_s=HOUR, dry_run=True), hours_later(2), Oracle({"gone": Listing("gone")}))
    assert sorted(store.list("")) == before
    assert {r.group for r in report.removed if r.kind == "disowned"} == {"snapshots/b1"}
    assert owners.claim_key("gone", "snapshots/b1") in {r.key for r in report.removed if r.kind == "claim"}


def test_without_an_oracle_claimed_images_are_kept_as_before(store: ObjectStore, tmp_path: Path) -> None:
    image(store, tmp_path, "snapshots/b1")
    registry(store, "gone", "snapshots/b1")
    collect(store, GcPolicy(grace_s=HOUR), hours_later(2))
    assert groups(store) == {"snapshots/b1"}


def test_an_unreadable_registry_record_keeps_its_images(store: ObjectStore, tmp_path: Path) -> None:
    image(store, tmp_path, "snapshots/b1")
    owners.claim(store, "broken", "snapshots/b1")
    store.put(owners.record_key("broken"), b"{not json")
    oracle = Oracle({"broken": Listing("gone")})
    collect(store, GcPolicy(grace_s=HOUR), hours_later(2), oracle)
    assert groups(store) == {"snapshots/b1"} and oracle.consulted == []


def test_a_leftover_without_a_manifest_of_a_gone_registry_goes_at_once(store: ObjectStore, tmp_path: Path) -> None:
    put_image(store, tmp_path, "snapshots/half", {0: b"half"}, None)  # a publish that died with its registry
    registry(store, "gone", "snapshots/half")
    for key in store.list("snapshots/half"):
        age(store, key, -2 * HOUR)  # younger than the grace: kept were it not disowned
    oracle = Oracle({"gone": Listing("gone")})
    collect(store, GcPolicy(grace_s=HOUR), hours_later(2), oracle)
    assert groups(store) == set() and store.list(owners.OWNERS) == [owners.record_key("gone")]
    collect(store, GcPolicy(grace_s=HOUR), hours_later(2), oracle)  # a registry's record goes after its claims
    assert store.list(owners.OWNERS) == []


def test_a_custom_template_of_a_gone_registry_goes_but_not_a_generation_a_listed_snapshot_sits_on(
    store: ObjectStore, tmp_path: Path
) -> None:
    def generation(name: str, gen: str) -> None:
        manifest = {"name": name, "generation": gen, "published_at": 0.0}
        put_image(store, tmp_path, f"templates/{name}/{gen}", {0: b"kernel", 1: f"{name} {gen}".encode()}, manifest)
        store.put(f"templates/{name}/latest", json.dumps({"generation": gen}).encode())

    for name, gen in (("tpl", "g1"), ("tpl", "g2"), ("held", "g1"), ("builtin", "g1")):
        generation(name, gen)
    put_image(store, tmp_path, "snapshots/s1", {0: b"kernel"}, {"template_prefix": "templates/held/g1"})
    registry(store, "gone", "templates/tpl", "templates/held")
    registry(store, "live", "snapshots/s1")  # s1 was imported by another registry, which still lists it
    oracle = Oracle({"gone": Listing("gone"), "live": Listing("live", frozenset({"s1"}))})

    collect(store, GcPolicy(grace_s=HOUR), hours_later(2), oracle)

    left = {k for k in store.list("templates") if k.endswith(("/manifest.json", "/latest"))}
    assert left == {
        "templates/held/g1/manifest.json",
        "templates/held/latest",
        "templates/builtin/g1/manifest.json",  # nobody claims a built-in
        "templates/builtin/latest",
    }
    assert live_problems(store) == [] and set(store.list("chunks")) == referenced(store)
    assert owners.claim_key("gone", "templates/tpl") not in store.list(owners.OWNERS)
    assert owners.claim_key("gone", "templates/held") in store.list(owners.OWNERS)  # it still holds a generation


def test_stored_volumes_of_deleted_volumes_and_gone_registries_go_and_live_ones_stay(
    store: ObjectStore, tmp_path: Path
) -> None:
    from cryobox.agent.volumes.transfer import store_volume
    from cryobox.objstore.leases import LeaseTiming

    ids = {"live": "vol-00000000000a", "deleted": "vol-00000000000b", "orphan": "vol-00000000000c"}
    for n, volume_id in enumerate(ids.values()):
        path = tmp_path / f"{volume_id}.ext4"
        path.write_bytes(f"the bytes of volume {n}".encode() * 1000)
        store_volume(store, volume_id, path, LeaseTiming(settle_s=0))
    registry(store, "live", f"volumes/{ids['live']}", f"volumes/{ids['deleted']}")
    registry(store, "gone", f"volumes/{ids['orphan']}")
    oracle = Oracle({"live": Listing("live", volumes=frozenset({ids["live"]})), "gone": Listing("gone")})

    collect(store, GcPolicy(grace_s=HOUR), hours_later(2), oracle)

    assert {k.split("/")[1] for k in store.list("volumes")} == {ids["live"]}
    assert set(store.list(f"volumes/{ids['live']}")) == {
        f"volumes/{ids['live']}/{n}" for n in ("image.idx", "manifest.json")
    }
    assert set(store.list("chunks")) == referenced(store) != set(), "the live volume's chunks stay, the others' go"
    assert len(store.list("chunks")) == 1
