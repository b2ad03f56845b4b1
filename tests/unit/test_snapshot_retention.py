"""Snapshot retention in the control plane: RetentionPolicy from the environment, and SnapshotControl's orphan /
sweep / reconcile rules on a real (SQLite) registry with a fake snapshot store and an injected clock."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from cryobox.agent.forking import Forking
from cryobox.agent.store.snapshots import SnapshotImage, SnapshotStore
from cryobox.errors import InvalidArgument, NotFound
from cryobox.registry import Registry, SnapshotRow
from cryobox.server.snapshots_ctl import (
    DEFAULT_GRACE_S,
    DEFAULT_SWEEP_INTERVAL_S,
    RetentionPolicy,
    SnapshotControl,
)

GRACE = 3600.0
T0 = 1_000_000.0

# -- RetentionPolicy.from_env ------------------------------------------------------------------------------------


def test_defaults() -> None:
    policy = RetentionPolicy.from_env(env={})
    assert policy == RetentionPolicy()
    assert policy.grace_s == DEFAULT_GRACE_S == 7 * 24 * 3600
    assert policy.sweep_interval_s == DEFAULT_SWEEP_INTERVAL_S == 900


def test_env_values() -> None:
    env = {"CRYOBOX_SNAPSHOT_GRACE_S": "60", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S": "2.5"}
    assert RetentionPolicy.from_env(env=env) == RetentionPolicy(grace_s=60.0, sweep_interval_s=2.5)


def test_empty_env_value_means_default() -> None:
    policy = RetentionPolicy.from_env(env={"CRYOBOX_SNAPSHOT_GRACE_S": "", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S": ""})
    assert policy == RetentionPolicy()


def test_explicit_arguments_win_over_env() -> None:
    env = {"CRYOBOX_SNAPSHOT_GRACE_S": "60", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S": "not even a number"}
    policy = RetentionPolicy.from_env(grace_s=0.0, sweep_interval_s=30.0, env=env)
    assert policy == RetentionPolicy(grace_s=0.0, sweep_interval_s=30.0)
    # one given, the other from env
    assert RetentionPolicy.from_env(sweep_interval_s=5.0, env={"CRYOBOX_SNAPSHOT_GRACE_S": "60"}) == RetentionPolicy(
        grace_s=60.0, sweep_interval_s=5.0
    )


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYOBOX_SNAPSHOT_GRACE_S", "120")
    monkeypatch.delenv("CRYOBOX_ORPHAN_SWEEP_INTERVAL_S", raising=False)
    assert RetentionPolicy.from_env() == RetentionPolicy(grace_s=120.0, sweep_interval_s=DEFAULT_SWEEP_INTERVAL_S)


@pytest.mark.parametrize("name", ["CRYOBOX_SNAPSHOT_GRACE_S", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S"])
@pytest.mark.parametrize("raw", ["soon", "1d", "-1", "-0.5", "nan"])
def test_bad_env_values(name: str, raw: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        RetentionPolicy.from_env(env={name: raw})


@pytest.mark.parametrize("kw", [{"grace_s": -1.0}, {"sweep_interval_s": -0.1}, {"grace_s": math.nan}])
def test_bad_explicit_values(kw: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        RetentionPolicy.from_env(env={}, **kw)


# -- SnapshotControl ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """Records what SnapshotControl asks of the snapshot store."""

    def __init__(self, ids: list[str] | None = None, fail: set[str] | None = None) -> None:
        self.present = list(ids or [])
        self.fail = fail or set()
        self.deleted: list[str] = []
        self.loaded: list[str] = []

    def delete(self, snapshot_id: str) -> None:
        if snapshot_id in self.fail:
            raise OSError(f"cannot remove {snapshot_id}")
        self.deleted.append(snapshot_id)
        if snapshot_id in self.present:
            self.present.remove(snapshot_id)

    def ids(self) -> list[str]:
        return list(self.present)

    def load(self, snapshot_id: str) -> SnapshotImage:
        self.loaded.append(snapshot_id)
        return cast(SnapshotImage, f"image of {snapshot_id}")


class Env:
    def __init__(self, registry: Registry, store: FakeStore, clock: Clock, control: SnapshotControl) -> None:
        self.registry = registry
        self.store = store
        self.clock = clock
        self.control = control
        self.ws = registry.ensure_workspace("alpha").id
        self.other_ws = registry.ensure_workspace("beta").id

    def add(self, snapshot_id: str, sandbox_id: str | None = "sbx-1", **kw: Any) -> None:
        """A snapshot of ``sandbox_id`` in workspace ``alpha``, with its files in the store."""
        self.store.present.append(snapshot_id)
        self.registry.add_snapshot(
            SnapshotRow(
                id=snapshot_id,
                workspace_id=self.ws,
                template="code-interpreter",
                path=f"/snapshots/{snapshot_id}",
                sandbox_id=sandbox_id,
                **kw,
            )
        )

    def row(self, snapshot_id: str) -> SnapshotRow:
        return self.registry.get_snapshot(snapshot_id)

    def ids(self) -> set[str]:
        return {row.id for row in self.registry.list_snapshots()}


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(f"sqlite:///{tmp_path / 'registry.sqlite'}")
    try:
        reg.migrate()
        yield reg
    finally:
        reg.close()


@pytest.fixture
def env(registry: Registry) -> Env:
    store = FakeStore()
    clock = Clock(T0)
    control = SnapshotControl(
        registry,
        cast(SnapshotStore, store),
        cast(Forking, object()),  # not used by the retention operations
        clock,
        RetentionPolicy(grace_s=GRACE, sweep_interval_s=60.0),
    )
    return Env(registry, store, clock, control)


async def test_sandbox_gone_deletes_unretained_and_orphans_retained(env: Env) -> None:
    env.add("snap-a", created_at=1.0)
    env.add("snap-b", created_at=2.0, retain=True)
    env.add("snap-c", created_at=3.0)
    env.add("snap-other", sandbox_id="sbx-2")

    deleted, orphaned = await env.control.sandbox_gone("sbx-1", keep_snapshots=False)

    assert sorted(deleted) == ["snap-a", "snap-c"]
    assert orphaned == ["snap-b"]
    assert sorted(env.store.deleted) == ["snap-a", "snap-c"]
    assert env.ids() == {"snap-b", "snap-other"}
    assert env.row("snap-b").orphaned_at == T0
    assert env.row("snap-b").retain is True
    assert env.row("snap-other").orphaned_at is None


async def test_sandbox_gone_keep_snapshots_orphans_all(env: Env) -> None:
    env.add("snap-a")
    env.add("snap-b", retain=True)
    deleted, orphaned = await env.control.sandbox_gone("sbx-1", keep_snapshots=True)
    assert deleted == []
    assert sorted(orphaned) == ["snap-a", "snap-b"]
    assert env.store.deleted == []
    assert env.row("snap-a").orphaned_at == T0 and env.row("snap-b").orphaned_at == T0


async def test_sandbox_gone_keeps_an_earlier_orphan_time(env: Env) -> None:
    env.add("snap-a", orphaned_at=T0 - 10)
    env.clock.now = T0 + 50
    deleted, orphaned = await env.control.sandbox_gone("sbx-1", keep_snapshots=True)
    assert (deleted, orphaned) == ([], ["snap-a"])
    assert env.row("snap-a").orphaned_at == T0 - 10  # the grace period is not restarted


async def test_sandbox_gone_of_unknown_sandbox(env: Env) -> None:
    env.add("snap-a")
    assert await env.control.sandbox_gone("sbx-nope", keep_snapshots=False) == ([], [])
    assert env.ids() == {"snap-a"} and env.store.deleted == []


async def test_sweep_waits_for_the_grace_period(env: Env) -> None:
    env.add("snap-a")
    env.add("snap-live", sandbox_id="sbx-2")  # not an orphan: never swept
    await env.control.sandbox_gone("sbx-1", keep_snapshots=True)

    assert await env.control.sweep() == []
    env.clock.now = T0 + GRACE - 1
    assert await env.control.sweep() == []
    assert env.ids() == {"snap-a", "snap-live"} and env.store.deleted == []

    env.clock.now = T0 + GRACE
    assert await env.control.sweep() == ["snap-a"]
    assert env.ids() == {"snap-live"}
    assert env.store.deleted == ["snap-a"]

    env.clock.now = T0 + 100 * GRACE
    assert await env.control.sweep() == []
    assert env.ids() == {"snap-live"}


async def test_retained_orphan_is_never_swept_until_released(env: Env) -> None:
    env.add("snap-keep", retain=True)
    await env.control.sandbox_gone("sbx-1", keep_snapshots=False)
    env.clock.now = T0 + 1000 * GRACE
    assert await env.control.sweep() == []
    assert env.ids() == {"snap-keep"}

    row = await env.control.update("snap-keep", env.ws, labels=None, retain=False)  # PATCH {"retain": false}
    assert row.retain is False and row.orphaned_at == T0  # still an orphan, since T0: its grace has ended
    assert await env.control.sweep() == ["snap-keep"]
    assert env.ids() == set() and env.store.deleted == ["snap-keep"]


async def test_released_orphan_still_gets_its_grace(env: Env) -> None:
    env.add("snap-keep", retain=True)
    await env.control.sandbox_gone("sbx-1", keep_snapshots=False)
    env.clock.now = T0 + GRACE / 2
    await env.control.update("snap-keep", env.ws, labels=None, retain=False)
    assert await env.control.sweep() == []
    env.clock.now = T0 + GRACE
    assert await env.control.sweep() == ["snap-keep"]


async def test_sweep_goes_on_when_a_file_delete_fails(env: Env) -> None:
    env.add("snap-a", orphaned_at=T0)
    env.add("snap-b", orphaned_at=T0)
    env.store.fail = {"snap-a"}
    env.clock.now = T0 + GRACE
    assert sorted(await env.control.sweep()) == ["snap-a", "snap-b"]
    assert env.store.deleted == ["snap-b"]
    assert env.ids() == set()  # the row goes first; the left-over files are removed by reconcile
    assert "snap-a" in env.store.ids()
    env.store.fail = set()
    await env.control.reconcile(set())
    assert env.store.ids() == []


async def test_reconcile_orphans_dead_sandboxes_and_removes_files_without_rows(env: Env) -> None:
    env.add("snap-live", sandbox_id="sbx-live")
    env.add("snap-dead", sandbox_id="sbx-dead")
    env.add("snap-nosbx", sandbox_id=None)
    env.add("snap-old-orphan", sandbox_id="sbx-dead", orphaned_at=T0 - 5)
    env.store.present += ["snap-stray-1", "snap-stray-2"]
    env.clock.now = T0 + 7

    await env.control.reconcile({"sbx-live"})

    assert env.row("snap-live").orphaned_at is None
    assert env.row("snap-dead").orphaned_at == T0 + 7
    assert env.row("snap-nosbx").orphaned_at == T0 + 7
    assert env.row("snap-old-orphan").orphaned_at == T0 - 5
    assert sorted(env.store.deleted) == ["snap-stray-1", "snap-stray-2"]
    assert env.ids() == {"snap-live", "snap-dead", "snap-nosbx", "snap-old-orphan"}

    # their grace starts at the restart
    env.clock.now = T0 + 7 + GRACE - 1
    assert await env.control.sweep() == ["snap-old-orphan"]
    env.clock.now = T0 + 7 + GRACE
    assert sorted(await env.control.sweep()) == ["snap-dead", "snap-nosbx"]
    assert env.ids() == {"snap-live"}


async def test_update(env: Env) -> None:
    env.add("snap-a", labels={"env": "dev"})
    with pytest.raises(InvalidArgument, match="nothing to update"):
        await env.control.update("snap-a", env.ws, labels=None, retain=None)
    row = await env.control.update("snap-a", env.ws, labels={"env": "prod"}, retain=True)
    assert row.labels == {"env": "prod"} and row.retain is True
    assert env.row("snap-a") == row
    row = await env.control.update("snap-a", env.ws, labels={}, retain=None)
    assert row.labels == {} and row.retain is True


async def test_other_workspace_sees_nothing(env: Env) -> None:
    env.add("snap-a")
    with pytest.raises(NotFound):
        await env.control.get("snap-a", env.other_ws)
    with pytest.raises(NotFound):
        await env.control.update("snap-a", env.other_ws, labels={"x": "y"}, retain=None)
    with pytest.raises(NotFound):
        await env.control.update("snap-a", env.other_ws, labels=None, retain=None)  # NotFound before "nothing"
    with pytest.raises(NotFound):
        await env.control.delete("snap-a", env.other_ws)
    with pytest.raises(NotFound):
        await env.control.image("snap-a", env.other_ws)
    assert env.store.deleted == [] and env.store.loaded == []
    assert env.row("snap-a").labels == {}
    assert await env.control.list_rows(env.other_ws, None, {}) == []

    assert (await env.control.get("snap-a", env.ws)).id == "snap-a"
    assert await env.control.image("snap-a", env.ws) == cast(SnapshotImage, "image of snap-a")
    await env.control.delete("snap-a", env.ws)
    assert env.ids() == set() and env.store.deleted == ["snap-a"]


async def test_missing_snapshot(env: Env) -> None:
    with pytest.raises(NotFound):
        await env.control.get("snap-nope", env.ws)
    with pytest.raises(NotFound):
        await env.control.update("snap-nope", env.ws, labels=None, retain=True)
    with pytest.raises(NotFound):
        await env.control.delete("snap-nope", env.ws)
    await env.control.delete("snap-nope", None)  # internal delete: idempotent
    assert env.store.deleted == ["snap-nope"]


async def test_list_rows_filters(env: Env) -> None:
    env.add("snap-a", labels={"env": "dev"}, created_at=1.0)
    env.add("snap-b", labels={"env": "prod"}, created_at=2.0)
    env.add("snap-c", sandbox_id="sbx-2", labels={"env": "prod"}, created_at=3.0)
    assert [r.id for r in await env.control.list_rows(env.ws, None, {})] == ["snap-c", "snap-b", "snap-a"]
    assert [r.id for r in await env.control.list_rows(env.ws, "sbx-1", {"env": "prod"})] == ["snap-b"]
