"""Templates in an S3 object store (a real S3-protocol server on loopback): one host bakes and publishes, another
host, with an empty image cache, restores from the store alone, paging guest RAM in chunk by chunk."""

from __future__ import annotations

from pathlib import Path

from cryobox.agent.reclaim import find_own_qemus
from cryobox.agent.templates import Template
from cryobox.bench.server import ServeProcess

from ..support_s3 import CREDENTIALS, moto_server
from .support import Client
from .test_lazy_memory import base_image, memstats


def test_cross_host_restore_from_s3(tmp_path: Path, cache_dir: Path, templates: dict[str, Template]) -> None:
    with moto_server() as moto:
        url = moto.url(moto.create_bucket("cryobox-images"))
        common = ["--store", url, "--templates", "base"]
        publisher = tmp_path / "a"
        with ServeProcess(publisher, cache_dir=cache_dir, prespawn=0, extra_args=common, extra_env=CREDENTIALS):
            pass  # start-up publishes the baked template (and records its prefetch trace through the store)
        assert find_own_qemus(publisher / "vol" / "run") == []

        empty_cache = tmp_path / "b-cache"
        data_dir = tmp_path / "b"
        args = [*common, "--template-source", "store", "--memory", "lazy"]
        with ServeProcess(data_dir, cache_dir=empty_cache, prespawn=0, extra_args=args, extra_env=CREDENTIALS) as other:
            client = Client(other.url, other.api_key)
            try:
                sandbox = client.create()
                assert client.sh(sandbox["id"], "echo restored elsewhere") == "restored elsewhere\n"
                assert client.sh(sandbox["id"], "cat /etc/debian_version").strip().startswith("12")
            finally:
                client.close()
            stats = memstats(data_dir, empty_cache)
            image = base_image(stats)
            assert stats["metrics"]["chunk_fetches"] > 0  # RAM came from S3, chunk by chunk
            assert image["touched"] < image["chunks"]
        # the other host built nothing: no debootstrap, no kernel build; it downloaded what it needed
        assert not (empty_cache / "images" / "debootstrap").exists()
        (fetched,) = (empty_cache / "templates").glob("base-*")
        assert not (fetched / "memory").exists(), "a fetched template's memory stays in the store"
        assert find_own_qemus(data_dir / "vol" / "run") == []
