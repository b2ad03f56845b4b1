"""Volumes on real VMs through ``/v1``: a volume mounted at create is a file system in the guest; what a sandbox
wrote and synced is there for the next one after a kill; one read-write sandbox at a time (a second is 409),
read-only ones see the data and cannot write; a volume in use cannot be deleted."""

from __future__ import annotations

import secrets

from tests.support.serve import Client


def test_a_volume_outlives_its_sandbox_with_one_writer_or_many_readers(client: Client) -> None:
    name = f"it-{secrets.token_hex(4)}"
    volume = client.call("POST", "/v1/volumes", 201, json={"name": name, "size_mb": 64})
    try:
        writer = client.create(volumes=[{"name": name, "path": "/data"}])["id"]
        mounts = client.sh(writer, "grep ' /data ' /proc/mounts")
        assert " ext4 " in mounts and "rw," in mounts, mounts
        client.sh(writer, "echo hello > /data/greeting && mkdir -p /data/d && sync")
        for mode in ({"path": "/x"}, {"path": "/ro", "read_only": True}):  # no second writer, no reader meanwhile
            busy = client.http.post("/v1/sandboxes", json={"template": "base", "volumes": [{"name": name, **mode}]})
            assert busy.status_code == 409, busy.text
        assert client.http.delete(f"/v1/volumes/{name}").status_code == 409
        client.call("DELETE", f"/v1/sandboxes/{writer}", 204)  # kill: detached, the data kept

        readers = [client.create(volumes=[{"name": name, "path": "/ro", "read_only": True}])["id"] for _ in range(2)]
        for reader in readers:
            assert client.sh(reader, "cat /ro/greeting; test -d /ro/d && echo dir") == "hello\ndir\n"
        refused = client.call(
            "POST", f"/v1/sandboxes/{readers[0]}/exec", json={"cmd": "touch /ro/nope", "timeout_seconds": 30}
        )
        assert refused["exit_code"] != 0 and "Read-only file system" in refused["stderr"], refused
        attached = client.call("GET", f"/v1/volumes/{name}")["attached_to"]
        assert sorted((a["sandbox_id"], a["read_only"]) for a in attached) == sorted((r, True) for r in readers)
        for reader in readers:
            client.call("DELETE", f"/v1/sandboxes/{reader}", 204)
        again = client.create(volumes=[{"name": name, "path": "/work"}])["id"]
        assert client.sh(again, "cat /work/greeting") == "hello\n"
        client.call("DELETE", f"/v1/sandboxes/{again}", 204)
        assert client.call("GET", f"/v1/volumes/{name}")["attached_to"] == []
    finally:
        client.http.delete(f"/v1/volumes/{name}")
    assert client.http.get(f"/v1/volumes/{name}").status_code == 404
    assert volume["id"].startswith("vol-")


def test_a_full_volume_is_the_guests_enospc_and_nobody_elses(client: Client) -> None:
    small, other = f"full-{secrets.token_hex(3)}", f"other-{secrets.token_hex(3)}"
    client.call("POST", "/v1/volumes", 201, json={"name": small, "size_mb": 16})
    client.call("POST", "/v1/volumes", 201, json={"name": other, "size_mb": 16})
    try:
        sbx = client.create(volumes=[{"name": small, "path": "/small"}, {"name": other, "path": "/other"}])["id"]
        filled = client.call(
            "POST",
            f"/v1/sandboxes/{sbx}/exec",
            json={"cmd": "dd if=/dev/zero of=/small/fill bs=1M count=64 conv=fsync", "timeout_seconds": 120},
        )
        assert filled["exit_code"] != 0 and "No space left on device" in filled["stderr"], filled
        # the other volume and the sandbox's own disk take writes as before
        assert client.sh(sbx, "echo ok > /other/f && sync && cat /other/f") == "ok\n"
        assert client.sh(sbx, "echo ok > /var/tmp/f && sync && cat /var/tmp/f") == "ok\n"
        client.call("DELETE", f"/v1/sandboxes/{sbx}", 204)
        got = client.call("GET", f"/v1/volumes/{small}")
        assert got["size_bytes"] == 16 << 20 and got["used_bytes"] is not None and got["used_bytes"] <= 16 << 20, got
    finally:
        for name in (small, other):
            client.http.delete(f"/v1/volumes/{name}")
