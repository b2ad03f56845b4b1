"""Volumes on real VMs through ``/v1``: a volume mounted at create is a file system in the guest; what a sandbox
wrote and synced is there for the next one after a kill; one read-write sandbox at a time (a second is 409),
read-only ones see the data and cannot write; a volume in use cannot be deleted."""

from __future__ import annotations

import secrets

from tests.support.serve import Client


def test_a_volume_outlives_its_sandbox_with_one_writer_and_many_readers(client: Client) -> None:
    name = f"it-{secrets.token_hex(4)}"
    volume = client.call("POST", "/v1/volumes", 201, json={"name": name, "size_mb": 64})
    try:
        writer = client.create(volumes=[{"name": name, "path": "/data"}])["id"]
        mounts = client.sh(writer, "grep ' /data ' /proc/mounts")
        assert " ext4 " in mounts and "rw," in mounts, mounts
        client.sh(writer, "echo hello > /data/greeting && mkdir -p /data/d && sync")
        second = client.http.post("/v1/sandboxes", json={"template": "base", "volumes": [{"name": name, "path": "/x"}]})
        assert second.status_code == 409, second.text
        reader = client.create(volumes=[{"name": name, "path": "/ro", "read_only": True}])["id"]
        assert client.sh(reader, "cat /ro/greeting") == "hello\n"
        refused = client.call(
            "POST", f"/v1/sandboxes/{reader}/exec", json={"cmd": "touch /ro/nope", "timeout_seconds": 30}
        )
        assert refused["exit_code"] != 0 and "Read-only file system" in refused["stderr"], refused
        attached = client.call("GET", f"/v1/volumes/{name}")["attached_to"]
        assert sorted((a["sandbox_id"], a["read_only"]) for a in attached) == sorted([(writer, False), (reader, True)])
        assert client.http.delete(f"/v1/volumes/{name}").status_code == 409

        client.call("DELETE", f"/v1/sandboxes/{writer}", 204)
        client.call("DELETE", f"/v1/sandboxes/{reader}", 204)
        again = client.create(volumes=[{"name": name, "path": "/work"}])["id"]
        assert client.sh(again, "cat /work/greeting; test -d /work/d && echo dir") == "hello\ndir\n"
        client.call("DELETE", f"/v1/sandboxes/{again}", 204)
        assert client.call("GET", f"/v1/volumes/{name}")["attached_to"] == []
    finally:
        client.http.delete(f"/v1/volumes/{name}")
    assert client.http.get(f"/v1/volumes/{name}").status_code == 404
    assert volume["id"].startswith("vol-")
