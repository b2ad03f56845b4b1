"""A snapshot's sizes a user sees, end to end: besides ``size_bytes`` (kept), ``unique_bytes`` (what only the
snapshot holds: the memory pages it changed from its parent image, device state, disk overlay) and
``shared_bytes`` (the memory it shares with its parent image). The agent reads them off the manifest, they cross
the seam, revision 0008 stores them (rows from before count everything as unique), an import reads them from the
published manifest (with the same fallback), and the routes answer with them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from alembic import command
from sqlalchemy import inspect, text

from cryobox.agent.hostagent import hibernations as hibernation_ops
from cryobox.agent.hostagent.snapshots import snapshot_info
from cryobox.agent.sandbox.admission import AdmissionConfig, AdmissionController
from cryobox.agent.sandbox.sandbox import SandboxState
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agentapi import models as am
from cryobox.registry import Registry
from cryobox.server.mapping import snapshot_row, snapshot_view
from tests.support import registry as registry_support
from tests.support.app import Env, agent, env, quota
from tests.support.control import Fleetish, made
from tests.support.registry import open_registry, snapshot

registry = registry_support.sqlite_registry
clock = registry_support.clock
db_url = registry_support.db_url
pg_server = registry_support.pg_server
__all__ = ["agent", "clock", "db_url", "env", "made", "pg_server", "quota", "registry"]  # fixtures

GiB = 1 << 30


def _image(tmp_path: Path, **sizes: int) -> SnapshotImage:
    manifest = {"id": "snap-1", "template": "base", "created_at": 1.0, "capture": {"pause_ms": 3.0}, **sizes}
    return SnapshotImage("snap-1", tmp_path / "snap-1", cast(Any, None), manifest)


# -- the agent ---------------------------------------------------------------------------------------------------


def test_snapshot_info_carries_the_manifests_sizes(tmp_path: Path) -> None:
    info = snapshot_info(_image(tmp_path, size_bytes=5 * GiB, unique_bytes=GiB, shared_bytes=4 * GiB))
    assert (info.size_bytes, info.unique_bytes, info.shared_bytes) == (5 * GiB, GiB, 4 * GiB)
    old = snapshot_info(_image(tmp_path, size_bytes=7))  # a manifest from before layering: all of it is its own
    assert (old.size_bytes, old.unique_bytes, old.shared_bytes) == (7, 7, 0)


async def test_a_stored_hibernation_reports_the_images_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    published = SimpleNamespace(key="hibernations/sb-1", manifest_sha256="ab" * 32)
    monkeypatch.setattr(hibernation_ops, "publish_hibernation", lambda *args, **kw: published)  # the upload is not this
    image = _image(tmp_path, size_bytes=30, unique_bytes=10, shared_bytes=20)
    sandbox = SimpleNamespace(
        id="sb-1",
        template="base",
        lock=asyncio.Lock(),
        hibernation=image,
        state=SandboxState.HIBERNATED,
        volumes=(),
    )
    service = SimpleNamespace(
        get=lambda sandbox_id: sandbox,
        template=lambda name: SimpleNamespace(generation="g1"),
        sandboxes={"sb-1": sandbox},
        hibernation=SimpleNamespace(root=tmp_path / "hibernate"),
    )
    host = SimpleNamespace(store=SimpleNamespace(url="memory://"), service=service)
    ops = hibernation_ops.HibernationOps(
        cast(Any, host), AdmissionController(AdmissionConfig()), info=lambda s: cast(Any, s)
    )
    stored = await ops.store("sb-1")
    assert (stored.size_bytes, stored.unique_bytes, stored.shared_bytes) == (30, 10, 20)


# -- the registry ------------------------------------------------------------------------------------------------


def test_the_sizes_round_trip_through_the_registry(registry: Registry) -> None:
    ws = registry.ensure_workspace("default").id
    row = snapshot("snap-s", ws, size_bytes=5 * GiB, unique_bytes=GiB + 1, shared_bytes=4 * GiB - 1)
    registry.add_snapshot(row)
    got = registry.get_snapshot("snap-s")
    assert got == row and (got.unique_bytes, got.shared_bytes) == (GiB + 1, 4 * GiB - 1)  # BigInteger: > 2 GiB
    assert registry.update_snapshot("snap-s", unique_bytes=2, shared_bytes=3).unique_bytes == 2
    [listed] = registry.list_snapshots(ws)
    assert (listed.unique_bytes, listed.shared_bytes) == (2, 3)


def test_0008_adds_the_sizes_and_counts_existing_snapshots_as_all_unique(db_url: str) -> None:
    with open_registry(db_url) as reg:
        db = reg.database
        cfg = db._alembic_config()
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0007")
        columns = {c["name"] for c in inspect(db.engine).get_columns("snapshots")}
        assert not {"unique_bytes", "shared_bytes"} & columns
        ws = reg.ensure_workspace("old")
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO snapshots (id, workspace_id, sandbox_id, template, parent_id, path, size_bytes, "
                    "pause_ms, labels, retain, created_at, orphaned_at, host, location, generation) VALUES "
                    "('snap-old', :ws, NULL, 't', NULL, '/p', :size, NULL, '{}', false, 1.0, NULL, 'h', 'local', 'g1')"
                ),
                {"ws": ws.id, "size": 6 * GiB},
            )
        reg.migrate()
        assert db.current_revision() == db.head_revision()  # 0008 and every later revision
        old = reg.get_snapshot("snap-old")
        assert (old.size_bytes, old.unique_bytes, old.shared_bytes) == (6 * GiB, 6 * GiB, 0)
        with db.engine.begin() as conn:  # a row written without them (an older replica) gets the defaults
            conn.execute(
                text(
                    "INSERT INTO snapshots (id, workspace_id, sandbox_id, template, parent_id, path, size_bytes, "
                    "pause_ms, labels, retain, created_at, orphaned_at) VALUES "
                    "('snap-new', :ws, NULL, 't', NULL, '/p', 5, NULL, '{}', false, 2.0, NULL)"
                ),
                {"ws": ws.id},
            )
        fresh = reg.get_snapshot("snap-new")
        assert (fresh.unique_bytes, fresh.shared_bytes) == (0, 0)
        with db.engine.begin() as conn:  # the downgrade works too, and the upgrade again after it
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
        columns = {c["name"] for c in inspect(db.engine).get_columns("snapshots")}
        assert not {"unique_bytes", "shared_bytes"} & columns and "size_bytes" in columns
        reg.migrate()
        assert reg.get_snapshot("snap-old").unique_bytes == 6 * GiB


# -- the control plane -------------------------------------------------------------------------------------------


def _info(**fields: Any) -> am.SnapshotInfo:
    return am.SnapshotInfo(id="snap-1", template="base", created_at=1.0, path="/p", **fields)


def test_a_row_takes_the_agents_sizes_and_an_older_agents_snapshot_is_all_unique() -> None:
    row = snapshot_row(_info(size_bytes=9, unique_bytes=2, shared_bytes=7), "ws", False, {}, "a")
    assert (row.size_bytes, row.unique_bytes, row.shared_bytes) == (9, 2, 7)
    zero = snapshot_row(_info(size_bytes=9, unique_bytes=0, shared_bytes=9), "ws", False, {}, "a")
    assert (zero.unique_bytes, zero.shared_bytes) == (0, 9)  # sent as 0: kept
    older = am.SnapshotInfo.model_validate_json(json.dumps({"id": "s", "template": "base", "size_bytes": 9}))
    row = snapshot_row(older, "ws", False, {}, "a")  # what an agent from before layering sends
    assert (row.size_bytes, row.unique_bytes, row.shared_bytes) == (9, 9, 0)


async def test_an_import_reads_the_sizes_from_the_published_manifest(made: Fleetish) -> None:
    c = made
    manifests = {
        "snap-layered": {"size_bytes": 300, "unique_bytes": 100, "shared_bytes": 200},
        "snap-before": {"size_bytes": 300},  # published before layering: all of it is its own
    }
    for snapshot_id, sizes in manifests.items():
        manifest = {"id": snapshot_id, "template": "base", "template_generation": "g1", **sizes}
        c.objects.put(f"snapshots/{snapshot_id}/manifest.json", json.dumps(manifest).encode())
    layered = await c.control.snapshots.import_published("snap-layered", c.ws, labels={}, retain=True)
    before = await c.control.snapshots.import_published("snap-before", c.ws, labels={}, retain=True)
    assert (layered.size_bytes, layered.unique_bytes, layered.shared_bytes) == (300, 100, 200)
    assert (before.size_bytes, before.unique_bytes, before.shared_bytes) == (300, 300, 0)
    assert c.registry.get_snapshot("snap-layered") == layered
    view = snapshot_view(layered).model_dump()
    assert (view["size_bytes"], view["unique_bytes"], view["shared_bytes"]) == (300, 100, 200)


async def test_the_snapshot_routes_answer_with_the_sizes(env: Env) -> None:
    sandbox = await env.made()
    taken = await env.client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={})
    assert taken.status_code == 201, taken.text
    body = taken.json()
    memory = 512 << 20  # the fake agent's guest: a quarter of its memory changed, the rest is the template's
    assert (body["unique_bytes"], body["shared_bytes"]) == (memory // 4, memory * 3 // 4)
    assert body["size_bytes"] == memory
    sizes = {k: body[k] for k in ("size_bytes", "unique_bytes", "shared_bytes")}
    got = (await env.client.get(f"/v1/snapshots/{body['id']}")).json()
    [listed] = (await env.client.get("/v1/snapshots")).json()["snapshots"]
    for seen in (got, listed):
        assert {k: seen[k] for k in sizes} == sizes
    row = env.registry.get_snapshot(body["id"])
    assert (row.unique_bytes, row.shared_bytes) == (memory // 4, memory * 3 // 4)
    schema = (await env.client.get("/openapi.json")).json()["components"]["schemas"]["Snapshot"]
    assert {"size_bytes", "unique_bytes", "shared_bytes"} <= set(schema["properties"])
