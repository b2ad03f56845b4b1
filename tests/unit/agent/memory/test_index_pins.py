"""Where the agent gets the pin of a lazily paged image's chunk index, and that the memory server honours it.

Templates published from this host record the pins ``publish_template`` returns (``record_pins``); fetched
templates and imported snapshots keep the pins of the manifest they were fetched with. The file name
``MemorySource`` maps carries that pin, and a memory server (a file:// store, no FUSE mount) loads the genuine
index under it and refuses a consistent index (with its chunks) swapped in afterwards.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from cryobox.agent.memory.client import MemoryServerProcess, MemServerConfig
from cryobox.agent.memory.hot import HotImages
from cryobox.agent.memory.server.main import MemoryServer
from cryobox.agent.memory.server.resolver import ResolverConfig
from cryobox.agent.memory.settings import MemoryMode
from cryobox.agent.publish.templates import import_snapshot, publish_snapshot, publish_template, upload_image
from cryobox.agent.sandbox.memsource import MemorySource
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agent.templates.bake import Template, record_pins
from cryobox.errors import IntegrityError
from cryobox.objstore.client import ObjectStore
from cryobox.objstore.pins import PinSet
from tests.support.images import (
    baked_template,
    fetch_base,
    file_store,
    machine_config,
    make_snapshot,
    make_template,
    sparse_image,
)

IDX = "templates/base/g1/memory.idx"


def _lazy(tmp_path: Path) -> MemorySource:
    client = MemoryServerProcess(MemServerConfig(tmp_path / "ms", "file://", tmp_path / "chunks", 1 << 30))
    return MemorySource(HotImages(tmp_path / "hot"), client, MemoryMode.LAZY, prefetch=False)


def _name(source: MemorySource, image: Template | SnapshotImage) -> str:
    return asyncio.run(source.backing(image)).path.name


def _loads(store: ObjectStore, name: str) -> int:
    """The image size a freshly started memory server finds under ``name`` (raises what its lookup raises)."""
    return MemoryServer(store, None, ResolverConfig(retries=0)).table.get(name).index.image_size


def _swap(store: ObjectStore, tmp_path: Path, prefix: str) -> None:
    """Replace ``prefix``'s memory image with another consistent index and its chunks (not pinned anywhere)."""
    evil = tmp_path / "evil.img"
    sparse_image(evil, 2, {1: b"attacker's guest ram"})
    upload_image(store, f"{prefix}/memory", evil, "g1", PinSet())


def test_a_template_published_here_records_the_pin_its_lazy_restores_name(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template = baked_template(tmp_path / "a")
    pins = publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    assert pins.pin(IDX).sha256 == hashlib.sha256(store.get(IDX)).hexdigest()
    recorded = record_pins(template, pins.to_json())
    on_disk = json.loads((template.path / "manifest.json").read_text())
    assert on_disk["pins"] == pins.to_json() == recorded.manifest["pins"]
    assert {k: v for k, v in on_disk.items() if k != "pins"} == template.manifest, "nothing else changes"
    assert record_pins(recorded, pins.to_json()) is recorded, "recorded once"
    with pytest.raises(IntegrityError, match="pins no hash"):
        _lazy(tmp_path).image_name(template)  # the bake's own manifest pins nothing: not paged unverified

    name = _name(_lazy(tmp_path), recorded)
    assert name == f"templates+base+g1@{pins.pin(IDX).sha256}"
    assert _loads(store, name) == template.memory.stat().st_size
    _swap(store, tmp_path, "templates/base/g1")
    with pytest.raises(IntegrityError, match="does not match its pin"):
        _loads(store, name)


def test_a_bake_published_before_pins_were_kept_is_pinned_from_its_own_memory(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template = baked_template(tmp_path / "a")
    published = publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    gets = store.stats.gets
    again = publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    # the store's manifest is read (is it in the current layout, which index does it pin?), nothing else
    assert again.to_json() == {IDX: published.pin(IDX).to_json()} and store.stats.gets == gets + 1
    assert _loads(store, _name(_lazy(tmp_path), record_pins(template, again.to_json()))) > 0

    other = baked_template(tmp_path / "b")  # another host's bake of the same generation: other RAM, same store name
    sparse_image(other.memory, 2, {1: b"another bake's guest ram"})
    pins = publish_template(store, other, tmp_path / "b" / "images", lambda _: None)
    assert pins.pin(IDX) != published.pin(IDX)
    with pytest.raises(IntegrityError):  # its vmstate does not go with the stored RAM: refused, not paged
        _loads(store, _name(_lazy(tmp_path / "b"), record_pins(other, pins.to_json())))


def test_a_fetched_template_keeps_its_manifests_pin(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    publish_template(store, baked_template(tmp_path / "a"), tmp_path / "a" / "images", lambda _: None)
    fetched = fetch_base(store, tmp_path)
    assert not fetched.memory.exists()
    name = _name(_lazy(tmp_path), fetched)
    assert name == f"templates+base+g1@{hashlib.sha256(store.get(IDX)).hexdigest()}"
    assert _loads(store, name) > 0
    _swap(store, tmp_path, "templates/base/g1")
    with pytest.raises(IntegrityError):
        _loads(store, name)


def test_an_imported_snapshot_keeps_its_manifests_pin(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    publish_snapshot(store, make_snapshot(tmp_path / "a" / "snapshots", template_a, machine), template_a)
    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")
    path = import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)
    image = SnapshotImage("snap-1", path, machine, json.loads((path / "manifest.json").read_text()))
    name = _name(_lazy(tmp_path), image)
    sha = hashlib.sha256(store.get("snapshots/snap-1/memory.idx")).hexdigest()
    assert name == f"snapshots+snap-1@{sha}"
    assert _loads(store, name) > 0
    _swap(store, tmp_path, "snapshots/snap-1")
    with pytest.raises(IntegrityError):
        _loads(store, name)
