"""The SDK and CLI surface for snapshots, forks and power states, against a real server."""

from __future__ import annotations

import json

import pytest

from cryobox import NotFound, Sandbox, Snapshots, StateError
from cryobox.bench.server import ServeProcess
from tests.support.serve import Api, cli


def test_sdk_snapshot_restore_fork_tree_promote(api: Api) -> None:
    with Sandbox.create(template="base", **api) as parent:
        parent.exec("echo sdk > /root/s", check=True)
        snap = parent.snapshot(labels={"via": "sdk"}, retain=False)
        assert snap.sandbox_id == parent.id and snap.labels == {"via": "sdk"} and snap.size_bytes > 0
        assert [s.id for s in parent.snapshots()] == [snap.id]

        with Sandbox.create(from_snapshot=snap.id, **api) as restored:
            assert restored.info.from_snapshot == snap.id
            assert restored.exec("cat /root/s").stdout == "sdk\n"

        tree = parent.fork_tree(2, metadata={"try": "x"})
        try:
            assert tree.errors == [] and len(tree.children) == 2
            assert [c.exec("cat /root/s").stdout for c in tree.children] == ["sdk\n", "sdk\n"]
            result = tree.promote(tree.children[0])
            assert result.winner == tree.children[0].id and result.deleted == [tree.children[1].id]
        finally:
            for child in tree.children:
                child.kill()

        parent.pause()
        assert parent.refresh().status == "paused"
        with pytest.raises(StateError):
            parent.exec("true")
        parent.resume()
        parent.hibernate()
        assert parent.info.status == "hibernated"
        assert parent.exec("cat /root/s").stdout == "sdk\n"  # a request wakes it
        assert parent.refresh().status == "running"

        with Snapshots(**api) as snapshots:
            assert [s.id for s in snapshots.list(labels={"via": "sdk"})] == [snap.id]
            updated = snapshots.update(snap.id, retain=True)
            assert updated.retain is True and updated.labels == {"via": "sdk"}
            parent.kill()
            assert snapshots.get(snap.id).retain is True  # retained: outlives its sandbox
            snapshots.delete(snap.id)
            with pytest.raises(NotFound):
                snapshots.get(snap.id)


def test_cli_snapshot_commands(server: ServeProcess, api: Api) -> None:
    env = {"CRYOBOX_API_URL": api["api_url"], "CRYOBOX_API_KEY": api["api_key"]}
    with Sandbox.create(template="base", **api) as sbx:
        made = cli("sandbox", "snapshot", sbx.id, "--label", "k=v", "--json", env=env)
        assert made.returncode == 0, made.stderr
        snap_id = json.loads(made.stdout)["id"]
        listed = cli("snapshot", "list", "--sandbox", sbx.id, "--json", env=env)
        assert [s["id"] for s in json.loads(listed.stdout)] == [snap_id], listed.stdout
        labelled = cli("snapshot", "label", snap_id, "extra=1", "--retain", "--json", env=env)
        assert labelled.returncode == 0, labelled.stderr
        got = json.loads(cli("snapshot", "get", snap_id, "--json", env=env).stdout)
        assert got["labels"] == {"k": "v", "extra": "1"} and got["retain"] is True
        assert cli("snapshot", "rm", snap_id, env=env).returncode == 0
        assert cli("snapshot", "get", snap_id, env=env).returncode != 0
