"""Templates from uploaded image archives on real build VMs, through cryobox's SDK: a legacy ``docker save`` tar of
a busybox-only image (no Python, no libc) is uploaded with ``Templates.build_from_image_archive``, the agent fetches
it from the object store, reads it in place and the build VM unpacks its layers; a sandbox of the template runs
with the image's ENV and WORKDIR and ``cat`` reads a file of the image. A second build names one image of a
two-image archive and runs a ``FROM archive`` Dockerfile's steps on it."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from cryobox.sdk import Templates
from tests.support.oci import BUSYBOX, Files, Link, merge_docker_archives, write_docker_archive

APPLETS = ("sh", "echo", "cat", "pwd", "ls", "true")


def busybox_root(**extra: bytes) -> Files:
    files: dict[str, bytes | Link] = {"bin/busybox": BUSYBOX.read_bytes()}
    files.update({f"bin/{applet}": Link("busybox") for applet in APPLETS})
    files.update(extra)
    return files


def delete(server: ServeProcess, name: str) -> None:
    httpx.delete(f"{server.url}/v1/templates/{name}", headers={"Authorization": f"Bearer {server.api_key}"})


def test_a_docker_save_archive_of_busybox_builds_and_boots(server: ServeProcess, tmp_path: Path) -> None:
    archive = tmp_path / "busybox-only.tar"
    write_docker_archive(
        archive,
        [busybox_root(), {"etc/motd": b"from the archive\n"}],
        tags=["busybox-only:1"],
        Env=["PATH=/bin", "GREETING=hi from the archive"],
        WorkingDir="/etc",
    )
    name = f"archive-{uuid.uuid4().hex[:8]}"
    try:
        with Templates(api_url=server.url, api_key=server.api_key) as templates:
            build = templates.build_from_image_archive(name, archive)
            lines: list[str] = []
            final = build.wait(on_log=lambda line: lines.append(line.message))
        assert final.status == "done", lines[-30:]
        assert any("loaded archive" in line for line in lines), lines
        with Sandbox.create(template=name, api_url=server.url, api_key=server.api_key) as sbx:
            assert sbx.exec("cat /etc/motd").stdout == "from the archive\n"
            probe = sbx.exec('echo "$GREETING"; pwd')
            assert probe.stdout.splitlines() == ["hi from the archive", "/etc"], probe
            bare = sbx.exec("ls /usr/lib/python3* /lib/x86_64-linux-gnu/libc.so.6 2>&1; echo end")
            assert "No such file" in bare.stdout  # nothing but the image (and the agent's own disk)
    finally:
        delete(server, name)


def test_a_named_image_of_an_archive_under_a_dockerfile(server: ServeProcess, tmp_path: Path) -> None:
    archive = tmp_path / "two.tar"
    write_docker_archive(archive, [busybox_root(**{"etc/which": b"only\n"})], tags=["one:1"], Env=["PATH=/bin"])
    other = tmp_path / "other.tar"
    write_docker_archive(other, [busybox_root(**{"etc/which": b"other\n"})], tags=["other:2"], Env=["PATH=/bin"])
    merged = merge_docker_archives(tmp_path / "merged.tar", [archive, other])
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "note").write_text("copied\n")
    name = f"archive-df-{uuid.uuid4().hex[:8]}"
    try:
        with Templates(api_url=server.url, api_key=server.api_key) as templates:
            build = templates.build_from_image_archive(
                name,
                merged,
                image="other:2",
                dockerfile="FROM archive\nCOPY note /etc/note\nRUN echo ran > /etc/ran\n",
                context=context,
            )
            lines: list[str] = []
            final = build.wait(on_log=lambda line: lines.append(line.message))
        assert final.status == "done", lines[-30:]
        with Sandbox.create(template=name, api_url=server.url, api_key=server.api_key) as sbx:
            assert sbx.exec("cat /etc/which /etc/note /etc/ran").stdout == "other\ncopied\nran\n"
    finally:
        delete(server, name)
