"""Snapshots and forks of sandboxes with volumes, on real VMs through ``/v1``: a snapshot records the mounts, not the
bytes (the source keeps writing to its volume after it, and a restore reads the volume as it is then); a volume in
use is a 409 that leaves it mounted; a restore while the volume is written elsewhere is a 409 that makes nothing;
``fork_tree`` children get their own copy-on-write clones of read-write volumes (new volumes named after them,
kept when the child goes) and the read-only volumes read-only; a ``fork`` child gets the same."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from tests.support.serve import Client

MOUNTED = "grep -c ' {path} ext4 ' /proc/mounts"


@pytest.fixture
def volumes(client: Client) -> Iterator[list[str]]:
    """Names of volumes the test makes (``make``): deleted after it, with every sandbox the client made first."""
    names: list[str] = []
    yield names
    for sandbox_id in client.created:
        client.http.delete(f"/v1/sandboxes/{sandbox_id}")
    client.created.clear()
    listed = client.call("GET", "/v1/volumes")["items"]
    for volume in listed:
        if any(volume["name"] == n or volume["name"].startswith(f"{n}-sb-") for n in names):
            client.http.delete(f"/v1/volumes/{volume['name']}")


def make(client: Client, names: list[str], prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    client.call("POST", "/v1/volumes", 201, json={"name": name, "size_mb": 64})
    names.append(name)
    return name


def _fails(client: Client, sandbox_id: str, cmd: str) -> str:
    result = client.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd, "timeout_seconds": 60})
    assert result["exit_code"] != 0, result
    return str(result["stderr"])


def _timed_snapshot(client: Client, sandbox_id: str) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    snap = client.snapshot(sandbox_id)
    return snap, (time.monotonic() - started) * 1000


def test_a_snapshot_records_the_mounts_and_a_restore_reads_the_volume_as_it_is(
    client: Client, volumes: list[str]
) -> None:
    name = make(client, volumes, "snap")
    source = client.create(volumes=[{"name": name, "path": "/data"}])["id"]
    client.sh(source, "echo before > /data/f && sync")
    plain = client.create()["id"]
    timings: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(3):  # alternating, so both see the same machine
        timings["without"].append(_timed_snapshot(client, plain)[1])
        snap, ms = _timed_snapshot(client, source)
        timings["with"].append(ms)
    print(f"snapshot ms (TCG): without a volume {timings['without']}, with one read-write volume {timings['with']}")

    # the source keeps its mount and writes on after the snapshot
    assert client.sh(source, MOUNTED.format(path="/data")) == "1\n"
    client.sh(source, "cat /data/f; echo after > /data/f && sync")
    assert client.sh(source, "cat /data/f") == "after\n"

    # while the source writes it, a restore is refused and makes nothing
    held = len(client.call("GET", "/v1/sandboxes")["items"])
    busy = client.http.post("/v1/sandboxes", json={"template": "base", "from_snapshot": snap["id"]})
    assert busy.status_code == 409, busy.text
    assert len(client.call("GET", "/v1/sandboxes")["items"]) == held
    attached = client.call("GET", f"/v1/volumes/{name}")["attached_to"]
    assert [(a["sandbox_id"], a["read_only"]) for a in attached] == [(source, False)]

    # the source goes (its volume stays): a restore mounts the same volume, with its bytes of now
    client.call("DELETE", f"/v1/sandboxes/{source}", 204, params={"keep_snapshots": "true"})
    restored = client.create(from_snapshot=snap["id"])["id"]
    assert client.sh(restored, MOUNTED.format(path="/data")) == "1\n"
    assert client.sh(restored, "cat /data/f") == "after\n"
    client.sh(restored, "echo restored > /data/g && sync")
    attached = client.call("GET", f"/v1/volumes/{name}")["attached_to"]
    assert [(a["sandbox_id"], a["path"], a["read_only"]) for a in attached] == [(restored, "/data", False)]


def test_a_snapshot_while_a_process_holds_the_volume_is_refused_and_changes_nothing(
    client: Client, volumes: list[str]
) -> None:
    name = make(client, volumes, "busy")
    sandbox = client.create(volumes=[{"name": name, "path": "/data"}])["id"]
    client.sh(sandbox, "echo kept > /data/f && sync")
    client.sh(sandbox, "nohup sh -c 'cd /data && exec sleep 600' >/dev/null 2>&1 & echo $! > /tmp/holder")
    client.sh(
        sandbox,
        'for i in $(seq 50); do [ "$(readlink /proc/$(cat /tmp/holder)/cwd)" = /data ] && break; sleep 0.1; done',
    )
    refused = client.http.post(f"/v1/sandboxes/{sandbox}/snapshots", json={})
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["details"]["state"] == "volume_busy" and body["details"]["path"] == "/data", body
    assert "/data" in body["error"] and "working directory" in body["error"]
    assert client.call("GET", "/v1/snapshots", params={"sandbox_id": sandbox})["snapshots"] == []
    assert client.sh(sandbox, MOUNTED.format(path="/data")) == "1\n"
    assert client.sh(sandbox, "cat /data/f && echo more >> /data/f && sync && wc -l < /data/f") == "kept\n2\n"
    client.sh(sandbox, "kill $(cat /tmp/holder)")
    client.sh(sandbox, "while kill -0 $(cat /tmp/holder) 2>/dev/null; do sleep 0.1; done")
    client.snapshot(sandbox)  # nothing holds it now
    assert client.sh(sandbox, MOUNTED.format(path="/data")) == "1\n"


def test_fork_tree_children_get_their_own_clones_and_share_read_only_volumes(
    client: Client, volumes: list[str]
) -> None:
    work, ref = make(client, volumes, "work"), make(client, volumes, "ref")
    writer = client.create(volumes=[{"name": ref, "path": "/ref"}])["id"]
    client.sh(writer, "echo reference > /ref/r && sync")
    client.call("DELETE", f"/v1/sandboxes/{writer}", 204)

    parent = client.create(volumes=[{"name": work, "path": "/work"}, {"name": ref, "path": "/ref", "read_only": True}])[
        "id"
    ]
    client.sh(parent, "echo base > /work/base && sync")
    tree = client.call("POST", f"/v1/sandboxes/{parent}/fork-tree", 201, json={"count": 2})
    client.track(*tree["children"])
    assert tree["errors"] == [] and len(tree["children"]) == 2
    children = [c["id"] for c in tree["children"]]
    for child in children:
        assert client.sh(child, "cat /work/base /ref/r") == "base\nreference\n"
        client.sh(child, f"echo {child} > /work/mine && sync")
        assert "Read-only file system" in _fails(client, child, "touch /ref/x")
    for child in children:  # each sees its own write only
        assert client.sh(child, "cat /work/mine") == f"{child}\n"
    client.sh(parent, "test ! -e /work/mine && echo base2 >> /work/base && sync")  # the parent writes on, alone
    assert client.sh(parent, "cat /work/base") == "base\nbase2\n"
    assert all(client.sh(c, "cat /work/base") == "base\n" for c in children)

    listed = {v["name"]: v for v in client.call("GET", "/v1/volumes")["items"]}
    for child in children:
        clone = listed[f"{work}-{child}"]
        assert [(a["sandbox_id"], a["path"], a["read_only"]) for a in clone["attached_to"]] == [(child, "/work", False)]
    readers = {a["sandbox_id"] for a in listed[ref]["attached_to"]}
    assert readers == {parent, *children}

    client.call("DELETE", f"/v1/sandboxes/{children[0]}", 204)
    kept = client.call("GET", f"/v1/volumes/{work}-{children[0]}")
    assert kept["attached_to"] == []  # data outlives the child
    again = client.create(volumes=[{"name": f"{work}-{children[0]}", "path": "/again"}])["id"]
    assert client.sh(again, "cat /again/mine") == f"{children[0]}\n"

    # a fork child (cold boot) gets a clone too, taken in the parent's pause
    forked = client.call("POST", f"/v1/sandboxes/{parent}/fork", 201, json={})["sandbox"]
    client.track(forked)
    assert client.sh(forked["id"], "cat /work/base /ref/r") == "base\nbase2\nreference\n"
    client.sh(forked["id"], "echo forked > /work/mine && sync")
    assert client.sh(parent, "test ! -e /work/mine && echo alone") == "alone\n"
    assert client.call("GET", f"/v1/volumes/{work}-{forked['id']}")["attached_to"][0]["sandbox_id"] == forked["id"]
