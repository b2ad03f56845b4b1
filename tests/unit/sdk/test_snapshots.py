"""SDK: snapshots, forks and power state over an httpx.MockTransport, for the sync and the async classes alike.

Every test runs twice (``api`` is parametrized ``sync`` / ``async``): the same calls are made on ``Sandbox`` /
``Snapshots`` and on ``AsyncSandbox`` / ``AsyncSnapshots``, and ``resolve`` awaits the result when there is one.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from cryobox import (
    AsyncForkTree,
    AsyncSandbox,
    AsyncSnapshots,
    ForkTree,
    ForkTreeError,
    PromoteFailure,
    PromoteResult,
    Sandbox,
    Snapshot,
    Snapshots,
)
from cryobox.errors import CryoboxError, HostUnavailable, InvalidArgument, NotFound, StateError
from tests.support.sdk import (
    CHILD_1,
    INFO,
    SNAP,
    TREE,
    FakeTime,
    MockApi,
    capacity,
    error_response,
    resolve,
    route,
    sequence,
)

SNAPSHOT = Snapshot(
    id="snp_0001",
    sandbox_id="sbx_0123",
    template="code-interpreter",
    size_bytes=123456,
    unique_bytes=23456,
    shared_bytes=100000,
    created_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
    labels={"step": "3"},
    retain=True,
    parent_id="snp_0000",
    pause_ms=18.5,
    location="stored",
    host="host-a",
)


async def release(obj: Sandbox | AsyncSandbox | ForkTree | AsyncForkTree) -> None:
    """``close()`` or ``await aclose()``."""
    if isinstance(obj, Sandbox | ForkTree):
        obj.close()
    else:
        await obj.aclose()


def _status(sbx: Sandbox | AsyncSandbox) -> str:
    return sbx.info.status


# parametrized error responses are built per request: one Response object cannot serve a sync and an async client
Reply = Callable[[], httpx.Response]


def not_found() -> httpx.Response:
    return error_response(404, "not_found", "no such thing")


def wrong_state() -> httpx.Response:
    return error_response(409, "wrong_state", "sandbox is paused")


def invalid() -> httpx.Response:
    return error_response(400, "invalid_argument", "bad input")


def refused() -> httpx.Response:
    return capacity(retry_after=None)


def _is_closed(obj: Sandbox | AsyncSandbox | Snapshots | AsyncSnapshots) -> bool:
    return obj._http.is_closed


def _json(request: httpx.Request) -> Any:
    return json.loads(request.content)


@pytest.fixture(params=["sync", "async"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[MockApi]:
    harness = MockApi(request.param)
    yield harness
    await harness.close()


# --- taking snapshots ------------------------------------------------------------------------------------------


async def test_snapshot_posts_options_and_parses(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(201, json=SNAP))
    snap = await resolve(sbx.snapshot({"step": "3"}, retain=True, quiesce=True))
    assert snap == SNAPSHOT
    assert snap.created_at.tzinfo is not None
    (request,) = rec.requests
    assert route(request) == ("POST", "/v1/sandboxes/sbx_0123/snapshots")
    assert _json(request) == {"labels": {"step": "3"}, "retain": True, "quiesce": True}


async def test_snapshot_parses_unique_and_shared_bytes(api: MockApi) -> None:
    sizes = {"size_bytes": 5 << 30, "unique_bytes": 1 << 30, "shared_bytes": 4 << 30}
    sbx, _ = api.sandbox(lambda request: httpx.Response(201, json={**SNAP, **sizes}))
    snap = await resolve(sbx.snapshot())
    assert (snap.size_bytes, snap.unique_bytes, snap.shared_bytes) == (5 << 30, 1 << 30, 4 << 30)
    sbx, _ = api.sandbox(lambda request: httpx.Response(201, json={**SNAP, "shared_bytes": "lots"}))
    with pytest.raises(CryoboxError):
        await resolve(sbx.snapshot())


async def test_snapshot_defaults(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(201, json=SNAP))
    await resolve(sbx.snapshot())
    assert _json(rec.requests[0]) == {"labels": {}, "retain": False, "quiesce": False}


@pytest.mark.parametrize(("reply", "cls"), [(not_found, NotFound), (wrong_state, StateError)])
async def test_snapshot_errors(api: MockApi, reply: Reply, cls: type[CryoboxError]) -> None:
    sbx, _ = api.sandbox(lambda request: reply())
    with pytest.raises(cls):
        await resolve(sbx.snapshot())


async def test_snapshot_malformed_response_is_cryobox_error(api: MockApi) -> None:
    sbx, _ = api.sandbox(lambda request: httpx.Response(201, json={**SNAP, "created_at": "yesterday"}))
    with pytest.raises(CryoboxError, match="unexpected response to POST /v1/sandboxes/sbx_0123/snapshots"):
        await resolve(sbx.snapshot())


async def test_sandbox_snapshots_lists_its_own(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(200, json={"snapshots": [SNAP]}))
    assert await resolve(sbx.snapshots()) == [SNAPSHOT]
    assert route(rec.requests[0]) == ("GET", "/v1/snapshots")
    assert dict(rec.requests[0].url.params) == {"sandbox_id": "sbx_0123"}


def test_snapshot_is_frozen() -> None:
    with pytest.raises(AttributeError):
        SNAPSHOT.retain = False  # type: ignore[misc]


# --- the Snapshots handle --------------------------------------------------------------------------------------


async def test_list_filters_by_sandbox_and_labels(api: MockApi) -> None:
    snapshots, rec = api.snapshots(lambda request: httpx.Response(200, json={"snapshots": [SNAP, SNAP]}))
    items = await resolve(snapshots.list(sandbox_id="sbx_0123", labels={"step": "3", "team": "a b"}))
    assert items == [SNAPSHOT, SNAPSHOT]
    assert route(rec.requests[0]) == ("GET", "/v1/snapshots")
    assert dict(rec.requests[0].url.params) == {"sandbox_id": "sbx_0123", "label.step": "3", "label.team": "a b"}


async def test_list_without_filters_and_minimal_snapshots(api: MockApi) -> None:
    """A snapshot without the cryobox extensions (a PandaStack-style body) parses with their defaults."""
    minimal = {k: SNAP[k] for k in ("id", "sandbox_id", "template", "size_bytes", "created_at")}
    snapshots, rec = api.snapshots(lambda request: httpx.Response(200, json={"snapshots": [minimal]}))
    (snap,) = await resolve(snapshots.list())
    assert (snap.labels, snap.retain, snap.parent_id, snap.pause_ms) == ({}, False, None, None)
    assert (snap.unique_bytes, snap.shared_bytes) == (0, 0)  # a server from before them
    assert rec.requests[0].url.query == b""


async def test_get_quotes_the_id(api: MockApi) -> None:
    snapshots, rec = api.snapshots(lambda request: httpx.Response(200, json=SNAP))
    assert await resolve(snapshots.get("snp/../x")) == SNAPSHOT
    assert rec.requests[0].method == "GET"
    assert rec.requests[0].url.raw_path == b"/v1/snapshots/snp%2F..%2Fx"


async def test_delete(api: MockApi) -> None:
    snapshots, rec = api.snapshots(lambda request: httpx.Response(204))
    await resolve(snapshots.delete("snp_0001"))
    assert route(rec.requests[0]) == ("DELETE", "/v1/snapshots/snp_0001")


async def test_update_sends_only_given_fields(api: MockApi) -> None:
    snapshots, rec = api.snapshots(lambda request: httpx.Response(200, json=SNAP))
    assert await resolve(snapshots.update("snp_0001", labels={"step": "3"}, retain=True)) == SNAPSHOT
    await resolve(snapshots.update("snp_0001", retain=False))
    await resolve(snapshots.update("snp_0001", labels={}))
    assert [route(r) for r in rec.requests] == [("PATCH", "/v1/snapshots/snp_0001")] * 3
    assert [_json(r) for r in rec.requests] == [
        {"labels": {"step": "3"}, "retain": True},
        {"retain": False},
        {"labels": {}},
    ]


@pytest.mark.parametrize(
    ("reply", "cls"), [(not_found, NotFound), (wrong_state, StateError), (invalid, InvalidArgument)]
)
async def test_snapshots_errors_map(api: MockApi, reply: Reply, cls: type[CryoboxError]) -> None:
    snapshots, _ = api.snapshots(lambda request: reply())
    with pytest.raises(cls):
        await resolve(snapshots.get("snp_x"))
    with pytest.raises(cls):
        await resolve(snapshots.delete("snp_x"))
    with pytest.raises(cls):
        await resolve(snapshots.update("snp_x", retain=True))
    with pytest.raises(cls):
        await resolve(snapshots.list())


async def test_snapshots_resolves_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYOBOX_API_URL", "http://env:9000/")
    monkeypatch.setenv("CRYOBOX_API_KEY", "env-key")
    with Snapshots() as snapshots:
        assert snapshots._http.base_url == "http://env:9000"
        assert snapshots._http.headers["Authorization"] == "Bearer env-key"
        assert "http://env:9000" in repr(snapshots)
    assert snapshots._http.is_closed
    async with AsyncSnapshots(api_url="http://arg:1", api_key="arg-key") as asnapshots:
        assert asnapshots._http.base_url == "http://arg:1"
        assert asnapshots._http.headers["Authorization"] == "Bearer arg-key"
    assert asnapshots._http.is_closed


# --- creating from a snapshot, killing with snapshots ----------------------------------------------------------


async def test_create_from_snapshot(api: MockApi) -> None:
    body = {**INFO, "from_snapshot": "snp_0001"}
    sbx, rec = await api.create(lambda request: httpx.Response(201, json=body), from_snapshot="snp_0001")
    assert sbx.info.from_snapshot == "snp_0001"
    assert _json(rec.requests[0])["from_snapshot"] == "snp_0001"


async def test_create_from_unknown_snapshot(api: MockApi) -> None:
    with pytest.raises(NotFound):
        await api.create(lambda request: error_response(404, "not_found", "no such snapshot"), from_snapshot="snp_gone")


@pytest.mark.parametrize(("keep", "params"), [(True, {"keep_snapshots": "true"}), (False, {})])
async def test_kill_keep_snapshots(api: MockApi, keep: bool, params: dict[str, str]) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(204))
    await resolve(sbx.kill(keep_snapshots=keep))
    assert route(rec.requests[0]) == ("DELETE", "/v1/sandboxes/sbx_0123")
    assert dict(rec.requests[0].url.params) == params
    assert _is_closed(sbx)


# --- power state -----------------------------------------------------------------------------------------------


async def test_pause_and_resume_set_status(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(204))
    await resolve(sbx.pause())
    assert _status(sbx) == "paused"
    await resolve(sbx.resume())
    assert _status(sbx) == "running"
    assert [route(r) for r in rec.requests] == [
        ("POST", "/v1/sandboxes/sbx_0123/pause"),
        ("POST", "/v1/sandboxes/sbx_0123/resume"),
    ]
    assert [r.content for r in rec.requests] == [b"", b""]


async def test_hibernate_and_wake_take_status_from_body(api: MockApi) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        status = "hibernated" if request.url.path.endswith("/hibernate") else "running"
        return httpx.Response(200, json={"status": status})

    sbx, rec = api.sandbox(handler)
    await resolve(sbx.hibernate())
    assert _status(sbx) == "hibernated"
    await resolve(sbx.wake())
    assert _status(sbx) == "running"
    assert [route(r) for r in rec.requests] == [
        ("POST", "/v1/sandboxes/sbx_0123/hibernate"),
        ("POST", "/v1/sandboxes/sbx_0123/wake"),
    ]


@pytest.mark.parametrize("action", ["pause", "resume", "hibernate", "wake"])
@pytest.mark.parametrize(("reply", "cls"), [(not_found, NotFound), (wrong_state, StateError)])
async def test_power_errors_keep_status(api: MockApi, action: str, reply: Reply, cls: type[CryoboxError]) -> None:
    sbx, _ = api.sandbox(lambda request: reply())
    with pytest.raises(cls):
        await resolve(getattr(sbx, action)())
    assert _status(sbx) == "running"


async def test_hibernate_malformed_status(api: MockApi) -> None:
    sbx, _ = api.sandbox(lambda request: httpx.Response(200, json={"status": "asleep"}))
    with pytest.raises(CryoboxError, match="unexpected response"):
        await resolve(sbx.hibernate())
    assert sbx.info.status == "running"


# --- forks -----------------------------------------------------------------------------------------------------


async def test_fork_returns_a_sandbox_sharing_the_client(api: MockApi) -> None:
    child_info = {**INFO, "id": "sbx_child", "metadata": {"role": "child"}}
    sbx, rec = api.sandbox(lambda request: httpx.Response(201, json={"parent_id": "sbx_0123", "sandbox": child_info}))
    child = await resolve(sbx.fork({"role": "child"}))
    assert type(child) is api.sandbox_cls
    assert child.id == "sbx_child"
    assert child.info.metadata == {"role": "child"}
    assert child._http is sbx._http
    assert child._config is sbx._config
    (request,) = rec.requests
    assert route(request) == ("POST", "/v1/sandboxes/sbx_0123/fork")
    assert _json(request) == {"metadata": {"role": "child"}}
    # the shared client stays open until the last of parent and child is closed, whatever the order
    await release(sbx)
    await release(sbx)  # idempotent: one holder released once
    assert not _is_closed(child)
    await release(child)
    assert _is_closed(child)


async def test_fork_default_metadata_and_errors(api: MockApi) -> None:
    responses = sequence(
        error_response(404, "not_found", "no such sandbox"),
        error_response(409, "wrong_state", "sandbox is hibernated"),
        lambda request: httpx.Response(201, json={"parent_id": "sbx_0123", "sandbox": INFO}),
    )
    sbx, rec = api.sandbox(responses)
    with pytest.raises(NotFound):
        await resolve(sbx.fork())
    with pytest.raises(StateError):
        await resolve(sbx.fork())
    await resolve(sbx.fork())
    assert _json(rec.requests[-1]) == {"metadata": {}}


async def test_fork_retries_capacity_refusals(api: MockApi) -> None:
    fake = FakeTime()
    fork_ok = httpx.Response(201, json={"parent_id": "sbx_0123", "sandbox": CHILD_1})
    sbx, rec = api.sandbox(sequence(capacity("2"), fork_ok), retry=fake.policy())
    assert (await resolve(sbx.fork())).id == "sbx_c1"
    assert fake.sleeps == [2.5]
    assert len(rec.requests) == 2


async def test_fork_tree(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(201, json=TREE))
    tree = await resolve(sbx.fork_tree(3, metadata={"run": "7"}))
    assert isinstance(tree, ForkTree if api.kind == "sync" else AsyncForkTree)
    assert (tree.tree_id, tree.parent_id, tree.snapshot_id) == ("tree_1", "sbx_0123", "snp_tree")
    assert [child.id for child in tree.children] == ["sbx_c1", "sbx_c2"]
    assert all(type(child) is api.sandbox_cls and child._http is sbx._http for child in tree.children)
    assert tree.errors == [ForkTreeError(index=2, error="no capacity")]
    (request,) = rec.requests
    assert route(request) == ("POST", "/v1/sandboxes/sbx_0123/fork-tree")
    assert _json(request) == {"count": 3, "metadata": {"run": "7"}}


async def test_fork_tree_defaults_and_missing_errors(api: MockApi) -> None:
    body = {k: v for k, v in TREE.items() if k != "errors"}
    sbx, rec = api.sandbox(lambda request: httpx.Response(201, json=body))
    tree = await resolve(sbx.fork_tree())
    assert tree.errors == []
    assert _json(rec.requests[0]) == {"count": 2, "metadata": {}}


@pytest.mark.parametrize(
    ("reply", "cls"),
    [(not_found, NotFound), (wrong_state, StateError), (invalid, InvalidArgument), (refused, HostUnavailable)],
)
async def test_fork_tree_errors(api: MockApi, reply: Reply, cls: type[CryoboxError]) -> None:
    sbx, _ = api.sandbox(lambda request: reply())
    with pytest.raises(cls):
        await resolve(sbx.fork_tree(17))


PROMOTED = {
    "winner": "sbx_c1",
    "tree_id": "tree_1",
    "deleted": ["sbx_c2"],
    "failures": [{"id": "sbx_c3", "error": "vmm gone"}],
}


async def test_promote(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda request: httpx.Response(200, json=PROMOTED), id="sbx_c1")
    result = await resolve(sbx.promote("tree_1"))
    assert result == PromoteResult(
        winner="sbx_c1", tree_id="tree_1", deleted=["sbx_c2"], failures=[PromoteFailure(id="sbx_c3", error="vmm gone")]
    )
    await resolve(sbx.promote("tree_1", cleanup_siblings=False))
    assert [route(r) for r in rec.requests] == [("POST", "/v1/sandboxes/sbx_c1/promote")] * 2
    assert [_json(r) for r in rec.requests] == [
        {"tree_id": "tree_1", "cleanup_siblings": True},
        {"tree_id": "tree_1", "cleanup_siblings": False},
    ]


@pytest.mark.parametrize(("reply", "cls"), [(not_found, NotFound), (wrong_state, StateError)])
async def test_promote_errors(api: MockApi, reply: Reply, cls: type[CryoboxError]) -> None:
    sbx, _ = api.sandbox(lambda request: reply())
    with pytest.raises(cls):
        await resolve(sbx.promote("tree_1"))


async def test_tree_promote_releases_deleted_siblings(api: MockApi) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/fork-tree"):
            return httpx.Response(201, json=TREE)
        return httpx.Response(200, json={**PROMOTED, "failures": []})

    sbx, rec = api.sandbox(handler)
    tree = await resolve(sbx.fork_tree())
    winner, loser = tree.children
    if isinstance(tree, ForkTree):
        assert isinstance(winner, Sandbox)
        result = tree.promote(winner)
    else:
        assert isinstance(winner, AsyncSandbox)
        result = await tree.promote(winner)
    assert result.deleted == ["sbx_c2"]
    assert route(rec.requests[-1]) == ("POST", "/v1/sandboxes/sbx_c1/promote")
    assert loser._released and not winner._released
    await release(sbx)
    assert not _is_closed(winner)  # the winner still holds the shared client
    await release(tree)
    assert _is_closed(winner)


# --- parity of the generated sync classes ----------------------------------------------------------------------


def _public(cls: type) -> set[str]:
    names = {name for name in vars(cls) if not name.startswith("_") or name in ("__enter__", "__aenter__")}
    return {{"aclose": "close", "__aenter__": "__enter__"}.get(name, name) for name in names}


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(Snapshots, AsyncSnapshots), (ForkTree, AsyncForkTree)])
def test_same_methods_as_sync(sync_cls: type, async_cls: type) -> None:
    assert _public(async_cls) == _public(sync_cls)
    for name, attr in vars(async_cls).items():
        if inspect.isfunction(attr) and not name.startswith("_") or name in ("__aenter__", "__aexit__"):
            assert inspect.iscoroutinefunction(attr), name


def test_new_sandbox_methods_exist_on_both() -> None:
    for name in ("snapshot", "snapshots", "fork", "fork_tree", "promote", "pause", "resume", "hibernate", "wake"):
        assert inspect.iscoroutinefunction(getattr(AsyncSandbox, name)), name
        assert not inspect.iscoroutinefunction(getattr(Sandbox, name)), name
        async_params = inspect.signature(getattr(AsyncSandbox, name)).parameters.values()
        sync_params = inspect.signature(getattr(Sandbox, name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in async_params] == [
            (p.name, p.kind, p.default) for p in sync_params
        ], name
