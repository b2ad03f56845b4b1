"""Templates and snapshots in an S3 object store (a real S3-protocol server on loopback): one host bakes,
publishes its template and a snapshot of a running sandbox; another host, with an empty image cache, restores
both from the store alone, paging guest RAM in chunk by chunk."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.memserver import base_image, memstats
from tests.support.s3 import CREDENTIALS, moto_server
from tests.support.serve import Client

SECRET_PROC = "import os, time; open('/tmp/secret', 'w').write(os.urandom(8).hex()); time.sleep(10**6)"


def test_cross_host_restore_from_s3(tmp_path: Path, cache_dir: Path, templates: dict[str, Template]) -> None:
    with moto_server() as moto:
        url = moto.url(moto.create_bucket("cryobox-images"))
        common = ["--store", url, "--templates", "base"]
        publisher = tmp_path / "a"
        # start-up publishes the baked template (and records its prefetch trace through the store)
        with ServeProcess(publisher, cache_dir=cache_dir, prespawn=0, extra_args=common, extra_env=CREDENTIALS) as a:
            client = Client(a.url, a.api_key)
            try:
                source = client.create()
                client.sh(source["id"], f'nohup python3 -c "{SECRET_PROC}" >/dev/null 2>&1 & sleep 1')
                secret = client.sh(source["id"], "cat /tmp/secret")
                # retained: deleting the sandbox below would otherwise delete the snapshot, its stored copy included
                snap = client.snapshot(source["id"], retain=True)
                published = client.call("POST", f"/v1/snapshots/{snap['id']}/publish")
                assert published["key"] == f"snapshots/{snap['id']}" and published["store"].startswith("s3://")
            finally:
                client.close()
        assert find_own_qemus(publisher / "vol" / "run") == []

        empty_cache = tmp_path / "b-cache"
        data_dir = tmp_path / "b"
        args = [*common, "--template-source", "store", "--memory", "lazy"]
        with ServeProcess(data_dir, cache_dir=empty_cache, prespawn=0, extra_args=args, extra_env=CREDENTIALS) as b:
            client = Client(b.url, b.api_key)
            try:
                sandbox = client.create()
                assert client.sh(sandbox["id"], "echo restored elsewhere") == "restored elsewhere\n"
                assert client.sh(sandbox["id"], "cat /etc/debian_version").strip().startswith("12")
                stats = memstats(data_dir, empty_cache)
                image = base_image(stats)
                assert stats["metrics"]["chunk_fetches"] > 0  # RAM came from S3, chunk by chunk
                assert image["touched"] < image["chunks"]

                # the running sandbox captured on the other host: its process and files are here
                client.call("POST", "/v1/snapshots/import", 404, json={"id": "snap-missing"})
                imported = client.call("POST", "/v1/snapshots/import", 201, json={"id": snap["id"]})
                assert imported["id"] == snap["id"] and imported["retain"] is True
                client.call("POST", "/v1/snapshots/import", 409, json={"id": snap["id"]})
                restored = client.create(from_snapshot=snap["id"])
                assert client.sh(restored["id"], "cat /tmp/secret") == secret
                assert client.sh(restored["id"], "pgrep -f 'time.sleep' >/dev/null && echo alive") == "alive\n"
                images = memstats(data_dir, empty_cache)["images"]
                # the memory server's name for it carries the pin of its chunk index, from the imported manifest
                (name,) = [n for n in images if n.startswith(f"snapshots+{snap['id']}@")]
                manifest = json.loads((data_dir / "vol" / "snapshots" / snap["id"] / "manifest.json").read_text())
                assert name.endswith("@" + manifest["pins"][f"snapshots/{snap['id']}/memory.idx"]["sha256"])
                snap_image = images[name]
                assert 0 < snap_image["touched"] < snap_image["chunks"]
            finally:
                client.close()
        # the other host built nothing: no debootstrap, no kernel build; it downloaded what it needed
        assert not (empty_cache / "images" / "debootstrap").exists()
        (fetched,) = (empty_cache / "templates").glob("base-*")
        assert not (fetched / "memory").exists(), "a fetched template's memory stays in the store"
        assert find_own_qemus(data_dir / "vol" / "run") == []

        # in the default (hot) mode the host brings the fetched memory home in the background; restores made
        # after that map the tmpfs copy, so their sandboxes snapshot with background-snapshot again
        hot_args = [*common, "--template-source", "store"]
        with ServeProcess(data_dir, cache_dir=empty_cache, prespawn=0, extra_args=hot_args, extra_env=CREDENTIALS) as b:
            deadline = time.monotonic() + 120
            while not (fetched / "memory").exists():
                assert time.monotonic() < deadline, "the fetched template's memory never came home"
                time.sleep(0.5)
            client = Client(b.url, b.api_key)
            try:
                sandbox = client.create()
                (pid,) = find_own_qemus(data_dir / "vol" / "run")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
                assert "/dev/shm/" in cmdline and "memserver/mnt" not in cmdline, cmdline
                client.sh(sandbox["id"], "echo home > /root/h")
                assert client.snapshot(sandbox["id"])["pause_ms"] > 0
                assert client.sh(sandbox["id"], "cat /root/h") == "home\n"
            finally:
                client.close()
