"""A fleet builds a recipe once: the published generation counts only when it was built from the same recipe and
size and restores here (QEMU, accelerator, store layout); a forced build never fetches."""

from __future__ import annotations

import dataclasses
import json

from cryobox.agent.host.recipes import published_build
from cryobox.image.recipe.model import Base, Recipe, Step
from cryobox.image.specs import TemplateSpec
from cryobox.objstore.client import open_store
from cryobox.objstore.keys import LAYOUT_VERSION, manifest_key, template_latest, template_prefix

RECIPE = Recipe(Base("debian", "bookworm"), (Step("RUN", ("echo hi",)),))
SPEC = TemplateSpec(name="web", packages=(), memory_mib=512, cpus=1, recipe=RECIPE.to_json())


def publish(store: object, spec: TemplateSpec, **changes: object) -> None:
    manifest = {
        "layout": LAYOUT_VERSION,
        "qemu": "QEMU 7.2",
        "machine_config": {"accel": "tcg"},
        "spec": {**spec.to_json(), "agent_disk": True, "files": {"/etc/cryobox/defaults.json": "{}"}},
        **changes,
    }
    store.put(manifest_key(template_prefix(spec.name, "g1")), json.dumps(manifest).encode())  # type: ignore[attr-defined]
    store.put(template_latest(spec.name), json.dumps({"generation": "g1"}).encode())  # type: ignore[attr-defined]


def test_the_same_recipe_published_by_another_agent_is_fetched() -> None:
    store = open_store("memory://")
    assert not published_build(store, SPEC, qemu="QEMU 7.2", accel="tcg")  # nothing published
    publish(store, SPEC)
    assert published_build(store, SPEC, qemu="QEMU 7.2", accel="tcg")
    assert not published_build(store, SPEC, qemu="QEMU 10.0", accel="tcg")
    assert not published_build(store, SPEC, qemu="QEMU 7.2", accel="kvm")
    assert not published_build(store, dataclasses.replace(SPEC, memory_mib=1024), qemu="QEMU 7.2", accel="tcg")
    other = Recipe(Base("debian", "bookworm"), (Step("RUN", ("echo other",)),))
    assert not published_build(store, dataclasses.replace(SPEC, recipe=other.to_json()), qemu="QEMU 7.2", accel="tcg")
    forced = dataclasses.replace(RECIPE, force=True)
    publish(store, dataclasses.replace(SPEC, recipe=forced.to_json()))
    assert not published_build(
        store, dataclasses.replace(SPEC, recipe=forced.to_json()), qemu="QEMU 7.2", accel="tcg"
    )  # --no-cache always builds


def test_an_older_store_layout_is_built_again() -> None:
    store = open_store("memory://")
    publish(store, SPEC, layout=LAYOUT_VERSION - 1)
    assert not published_build(store, SPEC, qemu="QEMU 7.2", accel="tcg")
