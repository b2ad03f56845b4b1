"""Snapshots, restore and fork as first-class operations, with real VMs (QEMU under TCG on these hosts)."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.serve import Client, new_key

# A process whose state lives only in its memory: a random secret made at start and a counter. SIGUSR1 makes it
# write both to /tmp/state; the secret is never written anywhere else, so reading it back after a restore
# proves the process's memory came through the snapshot.
STATEFUL = (
    "nohup python3 -c '"
    "import os, signal, time\n"
    "secret = os.urandom(16).hex(); count = 0\n"
    'def dump(*_): open("/tmp/state.tmp", "w").write(f"{secret} {count}"); os.rename("/tmp/state.tmp", "/tmp/state")\n'
    "signal.signal(signal.SIGUSR1, dump)\n"
    'open("/tmp/stateful.pid", "w").write(str(os.getpid()))\n'
    "while True:\n"
    "    count += 1; time.sleep(0.05)\n"
    "' >/dev/null 2>&1 &"
)
READ_STATE = (
    "rm -f /tmp/state; kill -USR1 $(cat /tmp/stateful.pid); "
    "for i in $(seq 100); do [ -f /tmp/state ] && break; sleep 0.05; done; cat /tmp/state"
)


def _start_stateful(client: Client, sandbox_id: str) -> tuple[str, int]:
    client.sh(sandbox_id, STATEFUL)
    client.sh(sandbox_id, "for i in $(seq 100); do [ -f /tmp/stateful.pid ] && break; sleep 0.05; done")
    secret, count = client.sh(sandbox_id, READ_STATE).split()
    return secret, int(count)


def test_file_and_process_memory_survive_snapshot_restore(client: Client) -> None:
    source = client.create()
    client.sh(source["id"], "echo before > /root/note")
    secret, count = _start_stateful(client, source["id"])

    snap = client.snapshot(source["id"], labels={"case": "survive"})
    assert snap["sandbox_id"] == source["id"] and snap["template"] == "base"
    files = {f["name"] for f in client.call("GET", f"/v1/snapshots/{snap['id']}/evidence")["files"]}
    assert {"console.log", "qemu.log"} <= files  # host-side evidence kept beside the snapshot
    client.call("PUT", f"/v1/snapshots/{snap['id']}/evidence/notes.txt", content=b"why")
    assert client.http.get(f"/v1/snapshots/{snap['id']}/evidence/notes.txt").content == b"why"
    assert snap["pause_ms"] is not None and snap["pause_ms"] > 0
    assert snap["size_bytes"] > 0

    # the source keeps running, and what it does next stays out of the snapshot
    client.sh(source["id"], "echo after > /root/note")
    assert client.sh(source["id"], READ_STATE).split()[0] == secret

    restored = client.create(from_snapshot=snap["id"])
    assert restored["from_snapshot"] == snap["id"]
    assert restored["boot_mode"] == "restore"
    assert client.sh(restored["id"], "cat /root/note") == "before\n"
    again_secret, again_count = client.sh(restored["id"], READ_STATE).split()
    assert again_secret == secret  # the same process, same memory
    assert int(again_count) >= count  # and it kept counting from where it was


def test_restores_diverge_independently(client: Client) -> None:
    source = client.create()
    client.sh(source["id"], "echo shared > /root/base")
    snap = client.snapshot(source["id"])
    first, second = client.create(from_snapshot=snap["id"]), client.create(from_snapshot=snap["id"])
    client.sh(first["id"], "echo one > /root/mine; echo one >> /root/base")
    client.sh(second["id"], "echo two > /root/mine")
    assert client.sh(first["id"], "cat /root/mine /root/base") == "one\nshared\none\n"
    assert client.sh(second["id"], "cat /root/mine /root/base") == "two\nshared\n"
    third = client.create(from_snapshot=snap["id"])
    assert client.sh(third["id"], "cat /root/base; test ! -e /root/mine && echo none") == "shared\nnone\n"


def test_snapshot_of_a_restored_sandbox_chains(client: Client) -> None:
    source = client.create()
    client.sh(source["id"], "echo gen1 > /root/gen")
    first = client.snapshot(source["id"])
    child = client.create(from_snapshot=first["id"])
    client.sh(child["id"], "echo gen2 >> /root/gen; head -c 8M /dev/urandom > /dev/shm/blob; md5sum /dev/shm/blob")
    blob = client.sh(child["id"], "md5sum < /dev/shm/blob")
    second = client.snapshot(child["id"])
    assert second["parent_id"] == first["id"]
    grandchild = client.create(from_snapshot=second["id"])
    assert client.sh(grandchild["id"], "cat /root/gen") == "gen1\ngen2\n"
    assert client.sh(grandchild["id"], "md5sum < /dev/shm/blob") == blob


def test_fork_child_has_the_parent_disk_but_fresh_processes(client: Client) -> None:
    parent = client.create()
    client.sh(parent["id"], "echo from-parent > /root/disk-file; sync")
    _start_stateful(client, parent["id"])
    forked = client.call("POST", f"/v1/sandboxes/{parent['id']}/fork", 201, json={"metadata": {"role": "child"}})
    child = forked["sandbox"]
    client.track(child)
    assert forked["parent_id"] == parent["id"]
    assert child["boot_mode"] == "cold" and child["status"] == "running" and child["metadata"] == {"role": "child"}
    assert client.sh(child["id"], "cat /root/disk-file") == "from-parent\n"
    assert client.sh(child["id"], "pgrep -f 'secret = os[.]urandom' || echo none") == "none\n"
    # the parent was only paused for the disk copy: its process is still there
    assert client.sh(parent["id"], "pgrep -f 'secret = os[.]urandom' >/dev/null && echo alive") == "alive\n"


def test_fork_tree_of_16_all_answer_and_promote_cleans_up(client: Client) -> None:
    """16 children of one state: each has the parent's files but its own entropy, instance id and address
    (this was agent/net/test_network.py's test_fork_tree_children_have_distinct_entropy_and_identity, on a fork
    tree of its own), and promoting one deletes the others."""
    parent = client.create()
    client.sh(parent["id"], "echo tree > /root/t")
    tree = client.call(
        "POST", f"/v1/sandboxes/{parent['id']}/fork-tree", 201, json={"count": 16, "metadata": {"exp": "t"}}
    )
    client.track(*tree["children"])
    assert tree["errors"] == [] and len(tree["children"]) == 16
    assert tree["parent_id"] == parent["id"]
    ids = [c["id"] for c in tree["children"]]
    assert len(set(ids)) == 16
    probe = "cat /root/t; od -An -tx1 -N16 /dev/urandom; cat /run/cryobox/instance-id"
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outputs = [o.splitlines() for o in pool.map(lambda i: client.sh(i, probe), ids)]
    assert all(len(o) == 3 and o[0] == "tree" for o in outputs), outputs
    randoms = {o[1].strip() for o in outputs}
    instance_ids = {o[2].strip() for o in outputs}
    assert len(randoms) == 16 and len(instance_ids) == 16  # fresh entropy and identity in every child
    assert instance_ids == {c["instance_id"] for c in tree["children"]}
    assert len({c["guest_ip"] for c in tree["children"]}) == 16
    snap = client.call("GET", f"/v1/snapshots/{tree['snapshot_id']}")
    assert snap["sandbox_id"] == parent["id"]

    winner = ids[3]
    result = client.call(
        "POST", f"/v1/sandboxes/{winner}/promote", json={"tree_id": tree["tree_id"], "cleanup_siblings": True}
    )
    assert result["winner"] == winner and result["failures"] == []
    assert sorted(result["deleted"]) == sorted(set(ids) - {winner})
    for gone in result["deleted"]:
        client.call("GET", f"/v1/sandboxes/{gone}", 404)
    assert client.sh(winner, "cat /root/t") == "tree\n"
    client.call("POST", f"/v1/sandboxes/{parent['id']}/promote", 404, json={"tree_id": tree["tree_id"]})


def test_delete_cascades_except_retain_and_keep_snapshots(client: Client) -> None:
    sandbox = client.create()
    plain = client.snapshot(sandbox["id"])
    kept = client.snapshot(sandbox["id"], retain=True, labels={"keep": "yes"})
    listed = client.call("GET", "/v1/snapshots", params={"sandbox_id": sandbox["id"]})["snapshots"]
    assert [s["id"] for s in listed] == [kept["id"], plain["id"]]  # newest first
    client.delete(sandbox["id"])
    client.call("GET", f"/v1/snapshots/{plain['id']}", 404)
    assert client.call("GET", f"/v1/snapshots/{kept['id']}")["retain"] is True
    # a retained snapshot outlives its sandbox and still restores
    revived = client.create(from_snapshot=kept["id"])
    assert client.sh(revived["id"], "echo ok") == "ok\n"
    client.call("DELETE", f"/v1/snapshots/{kept['id']}", 204)
    client.call("GET", f"/v1/snapshots/{kept['id']}", 404)

    other = client.create()
    a, b = client.snapshot(other["id"]), client.snapshot(other["id"])
    client.delete(other["id"], keep_snapshots="true")
    for snap in (a, b):
        client.call("GET", f"/v1/snapshots/{snap['id']}")
        client.call("DELETE", f"/v1/snapshots/{snap['id']}", 204)


def test_labels_filters_patch_and_bad_input(server: ServeProcess, client: Client) -> None:
    sandbox = client.create()
    snap = client.snapshot(sandbox["id"], labels={"suite": "labels", "run": "1"})
    found = client.call("GET", "/v1/snapshots", params={"label.suite": "labels", "label.run": "1"})["snapshots"]
    assert [s["id"] for s in found] == [snap["id"]]
    assert client.call("GET", "/v1/snapshots", params={"label.suite": "nope"})["snapshots"] == []
    patched = client.call("PATCH", f"/v1/snapshots/{snap['id']}", json={"labels": {"suite": "x"}, "retain": True})
    assert patched["labels"] == {"suite": "x"} and patched["retain"] is True
    client.call("PATCH", f"/v1/snapshots/{snap['id']}", 400, json={"bogus": 1})
    client.call("POST", f"/v1/sandboxes/{sandbox['id']}/snapshots", 400, json={"labels": "no"})
    client.call("POST", "/v1/sandboxes/sb-nope/snapshots", 404, json={})
    client.call("POST", "/v1/sandboxes", 404, json={"from_snapshot": "snap-nope"})
    client.call("POST", f"/v1/sandboxes/{sandbox['id']}/fork-tree", 400, json={"count": 17})
    client.call("POST", f"/v1/sandboxes/{sandbox['id']}/fork-tree", 400, json={"count": 0})
    assert client.call("GET", "/v1/snapshots", params={"label.suite": "x"})["snapshots"][0]["id"] == snap["id"]

    stranger = Client(server.url, new_key(server.data_dir, "strangers"))
    try:
        stranger.call("GET", f"/v1/snapshots/{snap['id']}", 404)
        stranger.call("DELETE", f"/v1/snapshots/{snap['id']}", 404)
        stranger.call("POST", "/v1/sandboxes", 404, json={"from_snapshot": snap["id"]})
        assert stranger.call("GET", "/v1/snapshots")["snapshots"] == []
    finally:
        stranger.close()
    client.call("DELETE", f"/v1/snapshots/{snap['id']}", 204)


def test_quiesce_refuses_with_an_open_connection(client: Client) -> None:
    sandbox = client.create()
    client.sh(
        sandbox["id"],
        "nohup python3 -c 'import socket, time\n"
        's = socket.socket(); s.bind(("127.0.0.1", 7000)); s.listen()\n'
        'c = socket.create_connection(("127.0.0.1", 7000)); a, _ = s.accept(); time.sleep(3600)\' '
        ">/dev/null 2>&1 & "
        "for i in $(seq 300); do awk '$4 == \"01\"' /proc/net/tcp | grep -q . && break; sleep 0.1; done",
    )
    refused = client.call("POST", f"/v1/sandboxes/{sandbox['id']}/snapshots", 409, json={"quiesce": True})
    assert "127.0.0.1:7000" in refused["error"]
    assert client.call("GET", "/v1/snapshots", params={"sandbox_id": sandbox["id"]})["snapshots"] == []
    client.snapshot(sandbox["id"])  # without quiesce it is allowed


def test_pause_resume_hibernate_and_transparent_wake(client: Client) -> None:
    sandbox = client.create()
    sid = sandbox["id"]
    secret, _ = _start_stateful(client, sid)
    client.call("POST", f"/v1/sandboxes/{sid}/pause", 204)
    assert client.call("GET", f"/v1/sandboxes/{sid}")["status"] == "paused"
    refused = client.call("POST", f"/v1/sandboxes/{sid}/exec", 409, json={"cmd": "true"})
    assert refused["code"]
    client.call("POST", f"/v1/sandboxes/{sid}/resume", 204)
    assert client.call("GET", f"/v1/sandboxes/{sid}")["status"] == "running"

    assert client.call("POST", f"/v1/sandboxes/{sid}/hibernate") == {"status": "hibernated"}
    assert client.call("GET", f"/v1/sandboxes/{sid}")["status"] == "hibernated"
    assert client.call("GET", "/v1/sandboxes", params={"status": "hibernated"})["items"][0]["id"] == sid
    time.sleep(2)
    # any request wakes it: the same processes, files and memory, and a clock stepped to the host's
    before = time.time()
    guest_now = float(client.sh(sid, "date +%s.%N"))
    after = time.time()
    assert before - 0.5 < guest_now < after + 0.5  # not 2 s behind: the clock was stepped on wake
    assert client.sh(sid, READ_STATE).split()[0] == secret
    assert client.call("GET", f"/v1/sandboxes/{sid}")["status"] == "running"
    assert client.call("POST", f"/v1/sandboxes/{sid}/wake") == {"status": "running"}

    # hibernate a paused sandbox, wake it explicitly
    client.call("POST", f"/v1/sandboxes/{sid}/pause", 204)
    client.call("POST", f"/v1/sandboxes/{sid}/hibernate")
    assert client.call("POST", f"/v1/sandboxes/{sid}/wake") == {"status": "running"}
    assert client.sh(sid, READ_STATE).split()[0] == secret


def test_a_paused_sandbox_is_captured_again_and_again(client: Client) -> None:
    """After one capture a paused VM idles in QEMU's postmigrate state, from which QEMU refuses another migration:
    the second snapshot of a paused sandbox (or its hibernation after a snapshot) was a 500."""
    sid = client.create()["id"]
    secret, _ = _start_stateful(client, sid)
    client.call("POST", f"/v1/sandboxes/{sid}/pause", 204)
    first, second = client.snapshot(sid), client.snapshot(sid)
    assert first["id"] != second["id"]
    assert client.call("GET", f"/v1/sandboxes/{sid}")["status"] == "paused"  # still paused between captures
    assert client.call("POST", f"/v1/sandboxes/{sid}/hibernate") == {"status": "hibernated"}
    assert client.call("POST", f"/v1/sandboxes/{sid}/wake") == {"status": "running"}
    assert client.sh(sid, READ_STATE).split()[0] == secret
    restored = client.create(from_snapshot=second["id"])
    assert client.sh(restored["id"], READ_STATE).split()[0] == secret


def test_orphans_are_swept_only_after_their_grace(
    tmp_path_factory: Any, cache_dir: Path, templates: dict[str, Template]
) -> None:
    args = ["--snapshot-grace", "4", "--orphan-sweep-interval", "0.5", "--templates", "base", "--net-pool", "2"]
    with ServeProcess(tmp_path_factory.mktemp("grace"), cache_dir=cache_dir, prespawn=0, extra_args=args) as srv:
        client = Client(srv.url, srv.api_key)
        try:
            sandbox = client.create()
            orphan = client.snapshot(sandbox["id"])
            retained = client.snapshot(sandbox["id"], retain=True)
            client.delete(sandbox["id"], keep_snapshots="true")
            deleted_at = time.monotonic()
            time.sleep(2)
            client.call("GET", f"/v1/snapshots/{orphan['id']}")  # grace not over: still there
            while time.monotonic() - deleted_at < 15:
                if client.http.get(f"/v1/snapshots/{orphan['id']}").status_code == 404:
                    break
                time.sleep(0.25)
            assert time.monotonic() - deleted_at >= 4
            client.call("GET", f"/v1/snapshots/{orphan['id']}", 404)
            files = srv.data_dir / "vol" / "snapshots" / orphan["id"]
            gone_by = time.monotonic() + 5  # the row goes first, then the agent's files
            while files.exists() and time.monotonic() < gone_by:
                time.sleep(0.1)
            assert not files.exists()
            client.call("GET", f"/v1/snapshots/{retained['id']}")  # retain: never swept
        finally:
            client.close()


# That a retained snapshot survives a server crash (SIGKILL, restart on the same data dir) is checked by
# agent/host/test_restart.py, on the crash it already makes.
