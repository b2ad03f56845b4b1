"""``cryobox gc --store``: what a store GC keeps, what it removes, leases, dry runs (a real file:// store)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cryobox.cli.main import app
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.gc import GcClock, GcPolicy, collect
from cryobox.objstore.leases import GC_PREFIX, LeaseTiming, PublishLease
from tests.support.storegc import (
    HOUR,
    age,
    hours_later,
    live_problems,
    put_generation,
    put_image,
    put_orphan,
    referenced,
)

T0 = time.time()
PAGES = {0: b"kernel", 1: b"libc", 2: b"heap"}


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def _generations(store: ObjectStore, work: Path) -> None:
    """base g1..g4, published an hour apart (g4 newest, latest); a snapshot sits on g1."""
    for n in range(1, 5):
        put_generation(store, work, f"g{n}", {**PAGES, 3: f"gen {n}".encode()}, T0 - (5 - n) * HOUR, latest=n == 4)
    put_image(store, work, "snapshots/s1", {**PAGES, 4: b"snap"}, {"template_prefix": "templates/base/g1"})


def test_a_run_keeps_every_live_image_whole_and_removes_what_nothing_needs(store: ObjectStore, tmp_path: Path) -> None:
    _generations(store, tmp_path)
    put_image(store, tmp_path, "hibernations/sb-1", {0: b"kernel", 5: b"hibernated"}, {"template": "base"})
    put_image(store, tmp_path, "snapshots/dead", {0: b"a deleted snapshot's own chunk"}, None)  # no manifest
    young = put_image(store, tmp_path, "snapshots/young", {0: b"a publish in progress"}, None)
    for key in store.list("snapshots/young") + [young.key(0), put_orphan(store, b"young orphan")]:
        age(store, key, -2 * HOUR)  # written "now" by the GC's clock: younger than the grace period
    old_orphan = put_orphan(store, b"old orphan")
    store.put("templates/base/g4/memory.pack", b"left by the earlier layout")
    chunks_before = set(store.list("chunks"))
    before = set(store.list(""))

    report = collect(store, GcPolicy(grace_s=HOUR), hours_later(2))

    assert live_problems(store) == []
    listed = store.list("")
    assert not [k for k in listed if k.startswith("templates/base/g2/")], "g2: out of the newest 2, unreferenced"
    for kept in ("g1", "g3", "g4"):  # g1: a live snapshot sits on it; g3, g4: the newest 2
        assert f"templates/base/{kept}/manifest.json" in listed
    assert "templates/base/g4/memory.pack" not in listed and "templates/base/latest" in listed
    assert not store.list("snapshots/dead") and len(store.list("snapshots/young")) == 2
    assert old_orphan not in listed and store.list("leases") == [] and store.list(GC_PREFIX) == []
    young_orphans = {k for k in chunks_before if k not in referenced(store)} - {old_orphan}
    young_orphans = {k for k in young_orphans if k in set(store.list("chunks"))}
    assert set(store.list("chunks")) == referenced(store) | young_orphans
    assert len(young_orphans) == 2  # the young orphan and the young publish's chunk

    kinds = report.by_kind()
    assert kinds["generation"][0] == 3 and kinds["stray"][0] == 2 and kinds["legacy"][0] == 1
    assert kinds["chunk"][0] == 3  # g2's own chunk, the dead snapshot's, the old orphan
    assert kinds["lease"][0] == 8  # every put_image took a lease; all expired
    assert {r.key for r in report.removed} == before - set(listed)
    assert report.removed_objects == sum(n for n, _ in kinds.values()) == len(before - set(listed))
    assert report.kept_objects == len(listed) and report.kept_bytes == sum(m.size for m in store.list_meta(""))
    assert report.complete and report.chunks_missing == [] and report.notes == []
    assert [r.key for r in report.removed if r.kind == "generation"][0] == "templates/base/g2/manifest.json"


def test_a_dry_run_lists_what_a_run_removes_and_removes_nothing(store: ObjectStore, tmp_path: Path) -> None:
    _generations(store, tmp_path)
    put_orphan(store, b"orphan")
    before = store.list("")
    dry = collect(store, GcPolicy(grace_s=HOUR, dry_run=True), hours_later(2))
    assert store.list("") == before
    real = collect(store, GcPolicy(grace_s=HOUR), hours_later(2))
    assert sorted(r.key for r in dry.removed) == sorted(r.key for r in real.removed) != []
    assert (dry.removed_bytes, dry.kept_objects) == (real.removed_bytes, real.kept_objects)


def test_generations_are_kept_until_out_of_the_newest_n_for_the_grace_period(
    store: ObjectStore, tmp_path: Path
) -> None:
    put_generation(store, tmp_path, "g1", {0: b"1"}, T0 - 3 * HOUR, latest=False)
    put_generation(store, tmp_path, "g2", {0: b"2"}, T0 - 2 * HOUR, latest=False)
    put_generation(store, tmp_path, "g3", {0: b"3"}, T0 - 0.5 * HOUR, latest=False)  # pushed g1 out 30 min ago
    expire_leases(store)
    collect(store, GcPolicy(grace_s=HOUR), GcClock())
    assert store.exists("templates/base/g1/manifest.json")
    collect(store, GcPolicy(grace_s=HOUR, keep_generations=1), GcClock())  # g2 pushed g1 out 2 h ago
    assert not store.exists("templates/base/g1/manifest.json") and store.exists("templates/base/g2/manifest.json")
    store.put("templates/base/latest", json.dumps({"generation": "g2"}).encode())
    put_generation(store, tmp_path, "g4", {0: b"4"}, T0 - 0.4 * HOUR, latest=False)
    expire_leases(store)
    collect(store, GcPolicy(grace_s=HOUR, keep_generations=1), GcClock())  # g3: pushed out by g4 24 min ago
    assert all(store.exists(f"templates/base/{g}/manifest.json") for g in ("g2", "g3", "g4"))
    collect(store, GcPolicy(grace_s=0, keep_generations=1), GcClock())
    assert not store.exists("templates/base/g3/manifest.json")
    assert store.exists("templates/base/g2/manifest.json"), "what latest names stays"


def expire_leases(store: ObjectStore) -> None:
    for key in store.list("leases"):
        age(store, key, 2 * HOUR)


def test_fresh_leases_keep_what_they_name(store: ObjectStore, tmp_path: Path) -> None:
    """A publish in progress relies on chunks no live index names yet, and writes under a manifest-less prefix."""
    orphan = put_orphan(store, b"a chunk a publish found in the store and will reuse")
    put_image(store, tmp_path, "snapshots/s2", {0: b"uploading"}, None)
    lease = PublishLease.begin(store, ["snapshots/s2"], [orphan.rsplit("/", 1)[1]], LeaseTiming(settle_s=0))
    for key in store.list(""):
        if key != lease.key:
            age(store, key, 2 * HOUR)
    report = collect(store, GcPolicy(grace_s=HOUR), GcClock())
    assert store.exists(orphan) and store.list("snapshots/s2") != [] and store.exists(lease.key)
    assert report.by_kind()["lease"][0] == 1  # put_image's own lease: expired
    age(store, lease.key, 2 * HOUR)  # the publish died long ago
    collect(store, GcPolicy(grace_s=HOUR), GcClock())
    assert not store.exists(orphan) and store.list("snapshots/s2") == [] and store.list("leases") == []


class LeaseMidRun:
    """A store on which a publish puts a lease (naming every old chunk and the stray prefix) just as the GC
    sends its first delete."""

    def __init__(self, inner: ObjectStore, chunks: list[str]) -> None:
        self.inner, self.chunks, self.deletes = inner, chunks, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def delete(self, key: str) -> None:
        if self.deletes == 0:
            PublishLease.begin(self.inner, ["snapshots/s2"], self.chunks, LeaseTiming(settle_s=0))
        self.deletes += 1
        self.inner.delete(key)


def test_a_lease_put_during_the_run_is_honoured(store: ObjectStore, tmp_path: Path) -> None:
    put_generation(store, tmp_path, "g1", {0: b"1"}, T0 - 5 * HOUR, latest=False)
    put_generation(store, tmp_path, "g2", {0: b"2"}, T0 - 4 * HOUR, latest=False)
    put_generation(store, tmp_path, "g3", {0: b"3"}, T0 - 3 * HOUR, latest=True)
    put_image(store, tmp_path, "snapshots/s2", {0: b"stray"}, None)
    orphans = [put_orphan(store, f"orphan {n}".encode()).rsplit("/", 1)[1] for n in range(3)]
    for key in store.list(""):
        age(store, key, 2 * HOUR)
    wrapped = LeaseMidRun(store, orphans)
    report = collect(wrapped, GcPolicy(grace_s=HOUR, window_s=1e-9), GcClock())  # type: ignore[arg-type]
    assert wrapped.deletes > 0 and not store.exists("templates/base/g1/manifest.json")  # deleted first
    assert all(store.exists(f"chunks/{sha[:2]}/{sha}") for sha in orphans), "named by the new lease"
    assert store.list("snapshots/s2") != [] and any("lease" in s for s in report.skipped)


def test_nothing_is_collected_while_a_live_index_cannot_be_read(store: ObjectStore, tmp_path: Path) -> None:
    put_image(store, tmp_path, "snapshots/s1", {0: b"live"}, {"template": "base"})
    store.put("snapshots/s1/memory.idx", b"garbage")
    orphan = put_orphan(store, b"orphan")
    put_image(store, tmp_path, "snapshots/dead", {0: b"dead"}, None)
    report = collect(store, GcPolicy(grace_s=HOUR), hours_later(2))
    assert store.exists(orphan) and any("snapshots/s1/memory.idx cannot be parsed" in n for n in report.notes)
    assert store.list("snapshots/dead") == []  # leftovers without a manifest still go


def test_an_earlier_layouts_live_template_is_left_whole(store: ObjectStore, tmp_path: Path) -> None:
    store.put("templates/base/g0/memory.idx", b'CRYOIDX1{"version":1}')
    store.put("templates/base/g0/memory.pack", b"all the chunks")
    store.put("templates/base/g0/manifest.json", json.dumps({"layout": 1, "published_at": T0}).encode())
    store.put("images/rootfs/r1/rootfs.idx", b'CRYOIDX1{"version":1}')
    store.put("images/rootfs/r1/rootfs.pack", b"rootfs chunks")
    store.put("images/rootfs/r0/rootfs.pack", b"a pack whose index was replaced by a new-format one")
    put_image(store, tmp_path, "images/rootfs/r0", {0: b"r0"}, None)
    before = set(store.list(""))
    report = collect(store, GcPolicy(grace_s=HOUR), hours_later(2))
    assert set(store.list("")) == before - {"images/rootfs/r0/rootfs.pack"} - set(store.list("leases")) - {
        k for k in before if k.startswith("leases/")
    }
    assert [r.key for r in report.removed if r.kind == "legacy"] == ["images/rootfs/r0/rootfs.pack"]


def test_a_publisher_waits_for_a_running_gc_to_see_its_lease(store: ObjectStore) -> None:
    calls: list[str] = []
    clock = iter(range(100))
    timing = LeaseTiming(clock=lambda: float(next(clock)), sleep=lambda s: calls.append(f"sleep {s}"), settle_s=2)
    assert PublishLease.begin(store, ["snapshots/a"], [], timing).waited_s == 0 and calls == []
    store.put(f"{GC_PREFIX}/running.json", b"{}")
    lease = PublishLease.begin(store, ["snapshots/a"], ["ab" * 32], timing)
    assert calls == ["sleep 1.0"] and lease.waited_s == 1.0  # 2 s after the lease was durable, 1 s gone already
    body = json.loads(store.get(lease.key))
    assert body["prefixes"] == ["snapshots/a"] and body["chunks"] == ["ab" * 32]


def test_a_run_announces_itself_and_removes_dead_gcs_markers(store: ObjectStore, tmp_path: Path) -> None:
    store.put(f"{GC_PREFIX}/dead.json", b"{}")
    seen: list[list[str]] = []

    class Spy:
        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def delete(self, key: str) -> None:
            seen.append(store.list(GC_PREFIX))
            store.delete(key)

    collect(Spy(), GcPolicy(grace_s=HOUR), hours_later(2))  # type: ignore[arg-type]
    assert len(seen[0]) == 2, "its own marker was there while it deleted"
    assert store.list(GC_PREFIX) == []


def test_policy_validation() -> None:
    for bad in ({"grace_s": -1}, {"keep_generations": 0}, {"window_s": 0}):
        with pytest.raises(Exception, match="grace"):
            GcPolicy(**bad)  # type: ignore[arg-type]


def test_the_cli_prints_a_summary_and_lists_on_a_dry_run(store: ObjectStore, tmp_path: Path) -> None:
    _generations(store, tmp_path)
    orphan = put_orphan(store, b"orphan")
    for key in store.list(""):
        age(store, key, 3 * HOUR)
    url = ["gc", "--store", "--store-url", store.url]
    dry = CliRunner().invoke(app, [*url, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    body = json.loads(dry.output)
    assert body["dry_run"] and orphan in body["keys"] and body["by_kind"]["generation"]["objects"] == 3
    assert store.exists(orphan)
    listing = CliRunner().invoke(app, [*url, "--dry-run"])
    assert f"would remove chunk      {orphan}" in listing.output, listing.output
    removed = body["removed"]["objects"]
    assert f"would remove {removed} objects" in listing.output and removed == 3 + 2 + 5  # g2, 2 chunks, leases
    assert CliRunner().invoke(app, [*url, "--grace", "1s"]).exit_code != 0  # shorter than a lease's refresh
    done = CliRunner().invoke(app, [*url, "--grace", "60m", "--keep-generations", "2"])
    assert done.exit_code == 0 and f"removed {removed} objects" in done.output and "kept 20 objects" in done.output
    assert not store.exists(orphan) and not store.exists("templates/base/g2/manifest.json")


def test_a_recipe_root_filesystem_no_manifest_names_is_collected_with_its_chunks(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A recipe template's flattened root filesystem is a base image made for that template alone: once no manifest
    names it (its template deleted) and it is older than the grace period, it goes with the chunks only it names;
    so does a built-in's root filesystem of an earlier image version. One a live template names stays, as do the
    build VM's (no manifest names it) and a young one."""
    named = put_image(store, tmp_path, "images/rootfs-recipe/named/rootfs.ext4", {0: b"named rootfs"}, None)
    orphan = put_image(
        store, tmp_path, "images/rootfs-recipe/gone/rootfs.ext4", {0: b"deleted template's rootfs"}, None
    )
    young = put_image(store, tmp_path, "images/rootfs-recipe/young/rootfs.ext4", {0: b"being published"}, None)
    shared = put_image(store, tmp_path, "images/rootfs/builtin/rootfs.ext4", {0: b"base's rootfs"}, None)
    earlier = put_image(store, tmp_path, "images/rootfs/earlier/rootfs.ext4", {0: b"an earlier version's"}, None)
    build_vm = put_image(store, tmp_path, "images/rootfs-vm/vm/rootfs.ext4", {0: b"the build VM's"}, None)
    for key in store.list("images/rootfs-recipe/young") + [young.key(0)]:
        age(store, key, -2 * HOUR)
    put_image(
        store,
        tmp_path,
        "templates/web/g1",
        {0: b"web memory"},
        {"name": "web", "generation": "g1", "files": {"rootfs": "images/rootfs-recipe/named/rootfs.ext4"}},
    )
    store.put("templates/web/latest", json.dumps({"generation": "g1"}).encode())
    put_generation(store, tmp_path, "g1", {0: b"base memory"}, 0.0, latest=True)  # a built-in's, naming its rootfs
    base = json.loads(store.get("templates/base/g1/manifest.json"))
    base["files"] = {"rootfs": "images/rootfs/builtin/rootfs.ext4"}
    store.put("templates/base/g1/manifest.json", json.dumps(base).encode())

    report = collect(store, GcPolicy(grace_s=HOUR), hours_later(2))

    listed = set(store.list(""))
    assert not store.list("images/rootfs-recipe/gone")
    assert orphan.key(0) not in listed  # its chunk: only the orphan named it
    for index in (named, young, shared, build_vm):
        assert index.key(0) in listed
    assert store.list("images/rootfs-recipe/named") and store.list("images/rootfs-recipe/young")
    assert store.list("images/rootfs/builtin") and store.list("images/rootfs-vm/vm")
    assert not store.list("images/rootfs/earlier") and earlier.key(0) not in listed  # nothing names it any more
    assert live_problems(store) == []
    assert report.by_kind()["image"][0] == len({r.key for r in report.removed if r.kind == "image"}) >= 1
