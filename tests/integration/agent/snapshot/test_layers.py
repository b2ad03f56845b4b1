"""Snapshots that cost what changed (issue 18), with real VMs: a snapshot of a restored sandbox stores the pages
it changed over its parent image, chains of snapshots restore byte-exact, deleting a generation in the middle
keeps the last restorable, and a capture gives the template's hot copy its holes back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryobox.bench.server import ServeProcess
from cryobox.config import DEFAULT_CACHE_DIR, Paths
from cryobox.util.files import allocated_bytes
from tests.support.serve import Client

MIB = 1 << 20
# 64 MiB of fresh random bytes in the guest's tmpfs (guest RAM), and their checksum
DIRTY_64 = "head -c 64M /dev/urandom > /dev/shm/buffer && sha256sum < /dev/shm/buffer"
CHECKSUM = "sha256sum < /dev/shm/buffer"


def _manifest(server: ServeProcess, snapshot_id: str) -> dict[str, Any]:
    path = server.data_dir / "vol" / "snapshots" / snapshot_id / "manifest.json"
    return dict(json.loads(path.read_text()))


def _hot_dir(server: ServeProcess) -> Path:
    return Paths(server.data_dir, server.cache_dir or DEFAULT_CACHE_DIR).hot_dir


def test_a_snapshot_of_a_1_gib_guest_that_dirtied_64_mib_stores_about_64_mib(
    server: ServeProcess, client: Client
) -> None:
    sandbox = client.create(template="code-interpreter")
    checksum = client.sh(sandbox["id"], DIRTY_64)
    snap = client.snapshot(sandbox["id"])
    manifest = _manifest(server, snap["id"])
    assert manifest["machine"]["memory_mib"] == 1024
    # the short-pause capture: device state + the pages it wrote, nothing streamed (agent/snapshot/devstate.py)
    assert manifest["capture"]["mode"] == "devices"
    assert manifest["capture"]["stream_bytes"] == 0 and manifest["capture"]["pause_ms"] > 0
    memory = manifest["memory"]
    assert memory["layered"] is True
    assert memory["parent"]["key"].startswith("tpl-code-interpreter-")
    own = memory["own_pages"] * 4096
    assert 64 * MIB <= own <= 1.2 * 64 * MIB, f"the snapshot holds {own / MIB:.1f} MiB of its own memory"
    # every page it wrote went through the staging buffer, and the fresh ones were found over the parent's holes
    # (asked of the parent's file on the volume: the tmpfs copy the VM maps has those pages allocated as zeros)
    counts = manifest["capture"]["counts"]
    assert counts["direct_pages"] == 0
    assert counts["staged_pages"] >= memory["own_pages"] + counts["same"]
    assert counts["over_holes"] * 4096 >= 32 * MIB, counts
    device_and_disk = manifest["unique_bytes"] - own
    vmstate = allocated_bytes(server.data_dir / "vol" / "snapshots" / snap["id"] / "vmstate")
    assert vmstate <= device_and_disk < vmstate + 16 * MIB
    assert manifest["shared_bytes"] > 100 * MIB  # the template's pages (the kernels, numpy, pandas) are shared
    assert manifest["size_bytes"] == manifest["unique_bytes"] + manifest["shared_bytes"]

    restored = client.create(from_snapshot=snap["id"])
    assert client.sh(restored["id"], CHECKSUM) == checksum
    for sid in (restored["id"], sandbox["id"]):
        client.call("DELETE", f"/v1/sandboxes/{sid}", status=204)
    # and the API says what the manifest says
    assert (snap["unique_bytes"], snap["shared_bytes"]) == (manifest["unique_bytes"], manifest["shared_bytes"])


def test_three_generations_restore_byte_exact_and_survive_deleting_the_middle_one(
    server: ServeProcess, client: Client
) -> None:
    source = client.create()
    checksum = client.sh(source["id"], DIRTY_64)
    generations = [client.snapshot(source["id"], retain=True)]
    for n in (2, 3):
        child = client.create(from_snapshot=generations[-1]["id"])
        client.sh(child["id"], f"echo gen{n} >> /root/gen")
        generations.append(client.snapshot(child["id"], retain=True))
        assert generations[-1]["parent_id"] == generations[-2]["id"]
        client.call("DELETE", f"/v1/sandboxes/{child['id']}", status=204)
    client.call("DELETE", f"/v1/sandboxes/{source['id']}", status=204)

    manifests = [_manifest(server, g["id"]) for g in generations]
    assert [m["capture"]["mode"] for m in manifests] == ["devices"] * 3
    for previous, manifest in zip(manifests, manifests[1:], strict=False):
        assert manifest["memory"]["parent"] == {"key": previous["id"], "digest": previous["memory"]["digest"]}
        # a generation that changed a line of a file and nothing else holds a few MiB, not the 64 MiB again
        assert manifest["memory"]["own_pages"] * 4096 < 24 * MIB
    assert manifests[0]["memory"]["own_pages"] * 4096 >= 64 * MIB

    client.call("DELETE", f"/v1/snapshots/{generations[1]['id']}", status=204)
    assert not (server.data_dir / "vol" / "snapshots" / generations[1]["id"]).exists()
    last = client.create(from_snapshot=generations[2]["id"])
    assert client.sh(last["id"], CHECKSUM) == checksum
    assert client.sh(last["id"], "cat /root/gen") == "gen2\ngen3\n"
    client.call("DELETE", f"/v1/sandboxes/{last['id']}", status=204)
    for g in (generations[0], generations[2]):
        client.call("DELETE", f"/v1/snapshots/{g['id']}", status=204)


def test_a_capture_leaves_the_templates_hot_copy_as_sparse_as_it_was(server: ServeProcess, client: Client) -> None:
    first = client.create()
    client.snapshot(first["id"])  # the template's copy has been made and punched once by now
    hot = next(_hot_dir(server).glob("tpl-base-*/memory"))
    before = allocated_bytes(hot)
    assert before < hot.stat().st_size // 2  # base: ~144 MiB of data in 512 MiB
    snaps = [client.snapshot(first["id"]) for _ in range(3)]
    assert allocated_bytes(hot) <= before + MIB
    assert not any((_hot_dir(server) / s["id"]).exists() for s in snaps)  # captures write to the volume only
    client.call("DELETE", f"/v1/sandboxes/{first['id']}", status=204)


def test_a_sandbox_that_keeps_writing_memory_is_snapshotted_and_the_snapshot_is_consistent(client: Client) -> None:
    # a pre-copy migration resends what the guest dirties; the last copy of every page must win. The process
    # writes its in-memory counter to a file (guest RAM too): had a stale copy of its memory won, the restored
    # process would go on from a smaller number than the file shows, and the file would go down
    source = client.create()
    client.sh(
        source["id"],
        "nohup python3 -c '"
        "import os\n"
        "b = bytearray(96 << 20); n = 0\n"
        "while True:\n"
        "    n += 1; b[(n * 4096) % len(b)] = n & 255\n"
        '    if n % 256 == 0: open("/dev/shm/n.tmp", "w").write(str(n)); os.rename("/dev/shm/n.tmp", "/dev/shm/n")\n'
        "' >/dev/null 2>&1 & for i in $(seq 300); do [ -f /dev/shm/n ] && break; sleep 0.1; done; sleep 0.5",
    )
    assert int(client.sh(source["id"], "cat /dev/shm/n")) > 0  # writing when the snapshot is taken
    snap = client.snapshot(source["id"])
    assert snap["pause_ms"] is not None and snap["pause_ms"] > 0
    restored = client.create(from_snapshot=snap["id"])
    first = int(client.sh(restored["id"], "cat /dev/shm/n"))
    assert first > 0
    later = int(client.sh(restored["id"], "sleep 2; cat /dev/shm/n"))
    assert later > first  # the writer came through alive and goes on from where its file says it was
    for sid in (restored["id"], source["id"]):
        client.call("DELETE", f"/v1/sandboxes/{sid}", status=204)
