"""The store's step layers: what is usable, what the budget removes (least recently used, a parent no earlier than
its descendants, metas first), broken chains and strays, and ``cryobox gc --store`` reporting and removing them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cryobox.cli.main import app
from cryobox.objstore.buildsteps import StepEntry, StepMeta, group_steps, plan_steps, read_metas
from cryobox.objstore.client import ObjectMeta, ObjectStore, open_store
from cryobox.objstore.gc import GcPolicy, collect
from cryobox.objstore.keys import build_step_layer, build_step_meta
from tests.support.storegc import HOUR, age, hours_later

NOW = time.time()
R, A, B, S = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def _meta(key: str, parent: str | None, last_used: float, data: bytes, base: str = "base-id") -> StepMeta:
    return StepMeta(
        key=key,
        version=f"v-{key[:4]}",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        parent=parent,
        parent_version=f"v-{parent[:4]}" if parent else None,
        base=None if parent else base,
        created=last_used,
        last_used=last_used,
    )


def _entries(*metas: StepMeta, modified: float = NOW - 2 * HOUR) -> dict[str, StepEntry]:
    entries = {}
    for meta in metas:
        objects = [
            ObjectMeta(meta.layer_key, meta.size, None, modified),
            ObjectMeta(build_step_meta(meta.key), 300, None, modified),
        ]
        entries[meta.key] = StepEntry(meta.key, objects, meta)
    return entries


def test_the_budget_removes_least_recently_used_with_a_parent_no_earlier_than_its_children() -> None:
    # R (used long ago) -> A -> B (used most recently); S alone, used in between
    chain = [_meta(R, None, NOW - 9 * HOUR, b"r" * 100), _meta(A, R, NOW - 8 * HOUR, b"a" * 100)]
    entries = _entries(*chain, _meta(B, A, NOW - HOUR, b"b" * 100), _meta(S, None, NOW - 5 * HOUR, b"s" * 100))
    total = sum(e.size for e in entries.values())
    assert plan_steps(entries, total, NOW, HOUR) == []
    first = plan_steps(entries, total - 1, NOW, HOUR)
    assert [(r.key, r.reason) for r in first] == [(build_step_meta(S), "budget"), (entries[S].objects[0].key, "budget")]
    everything = [r.key.split("/")[1] for r in plan_steps(entries, 0, NOW, HOUR) if r.key.endswith("meta.json")]
    assert everything == [S, B, A, R]  # children before parents


def test_broken_chains_and_strays_go_and_an_unreadable_meta_stops_the_rest() -> None:
    root = _meta(R, None, NOW, b"r")
    orphan = _meta(A, S, NOW, b"a")  # S is not in the store
    other = _meta(B, R, NOW, b"b")
    entries = _entries(root, orphan, dataclasses.replace(other, parent_version="another build of R"))
    young = ObjectMeta(f"build-steps/{R}/{'e' * 64}.qcow2", 5, None, NOW - 60)  # a racing upload, just now
    old = ObjectMeta(f"build-steps/{R}/{'f' * 64}.qcow2", 7, None, NOW - 2 * HOUR)  # a race's loser
    entries[R].objects += [young, old]
    entries["9" * 64] = StepEntry("9" * 64, [ObjectMeta(f"build-steps/{'9' * 64}/{'0' * 64}.qcow2", 9, None, 0.0)])
    planned = {(r.key, r.reason) for r in plan_steps(entries, 1 << 40, NOW, HOUR)}
    assert planned == {
        (build_step_meta(A), "broken"),
        (orphan.layer_key, "broken"),
        (build_step_meta(B), "broken"),
        (entries[B].objects[0].key, "broken"),
        (old.key, "stray"),
        (f"build-steps/{'9' * 64}/{'0' * 64}.qcow2", "stray"),
    }
    entries[R].unreadable, entries[R].meta = True, None
    planned = {(r.key, r.reason) for r in plan_steps(entries, 0, NOW, HOUR)}
    assert planned == {(f"build-steps/{'9' * 64}/{'0' * 64}.qcow2", "stray")}


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def _put(store: ObjectStore, meta: StepMeta, data: bytes) -> None:
    store.put(build_step_layer(meta.key, meta.sha256), data)
    store.put(build_step_meta(meta.key), meta.to_bytes())


def test_store_gc_reports_and_removes_step_layers_over_budget_and_broken(store: ObjectStore) -> None:
    data = {key: key[:1].encode() * 1000 for key in (R, A, S)}
    _put(store, _meta(R, None, NOW - 5 * HOUR, data[R]), data[R])
    _put(store, _meta(A, R, NOW - 4 * HOUR, data[A]), data[A])
    _put(store, _meta(S, None, NOW - HOUR, data[S]), data[S])
    store.put(build_step_meta(B), b"{not json")  # unparsable: a broken entry
    for key in store.list(""):
        age(store, key, 3 * HOUR)
    entries = group_steps(store.list_meta("build-steps"))
    assert read_metas(store, entries) == [] and entries[B].malformed and entries[S].meta is not None
    budget = sum(m.size for m in store.list_meta(f"build-steps/{S}"))

    dry = collect(store, GcPolicy(grace_s=HOUR, dry_run=True, step_budget=budget), hours_later(0))
    steps = [r.key for r in dry.removed if r.kind == "step"]
    assert set(steps) == set(store.list(f"build-steps/{A}") + store.list(f"build-steps/{R}") + [build_step_meta(B)])
    assert steps.index(build_step_meta(A)) < steps.index(build_step_meta(R))
    assert dry.by_kind()["step"][0] == 5 and store.exists(build_step_meta(R))

    url = ["gc", "--store", "--store-url", store.url, "--dry-run"]
    listing = CliRunner().invoke(app, url, env={"CRYOBOX_BUILD_CACHE_STORE_BYTES": str(budget)})
    assert listing.exit_code == 0, listing.output
    assert f"would remove step       {build_step_meta(R)}" in listing.output, listing.output
    keep_all = CliRunner().invoke(app, [*url, "--json"], env={"CRYOBOX_BUILD_CACHE_STORE_BYTES": str(1 << 40)})
    assert json.loads(keep_all.output)["by_kind"]["step"]["objects"] == 1  # only B's unparsable meta

    done = collect(store, GcPolicy(grace_s=HOUR, step_budget=budget), hours_later(0))
    assert {r.key for r in done.removed if r.kind == "step"} == set(steps)
    assert store.list("build-steps") == store.list(f"build-steps/{S}")
