"""Builds through cryobox's own front doors and PandaStack's, on real build VMs: the CLI builds a Dockerfile with
a context (COPY, ENV, WORKDIR, a start command), the SDK builds from an image pushed to a loopback registry, and
PandaStack's SDK builds a Dockerfile and creates a sandbox from it. Each sandbox shows what its recipe made."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pandastack

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from cryobox.sdk import Templates
from tests.support import oci_registry as oci_registry_support
from tests.support.oci import BUSYBOX, LayoutWriter, Link
from tests.support.oci_registry import OciRegistry, push_layout

oci_registry = oci_registry_support.oci_registry

DOCKERFILE = """\
# syntax=docker/dockerfile:1
FROM debian:bookworm
ARG FLAVOUR=plain
COPY site/ /srv/site/
ENV MODE=served FLAVOUR=${FLAVOUR}
WORKDIR /srv/site
RUN echo "flavour $FLAVOUR" > flavour.txt
EXPOSE 8080
CMD ["python3", "-m", "http.server", "8080"]
"""


def delete(server: ServeProcess, name: str) -> None:
    httpx.delete(f"{server.url}/v1/templates/{name}", headers={"Authorization": f"Bearer {server.api_key}"})


def test_the_cli_builds_a_dockerfile_whose_server_answers_at_create(server: ServeProcess, tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    (context / "site").mkdir(parents=True)
    (context / "site" / "index.html").write_text("<h1>built</h1>\n")
    (context / "site" / "secret.key").write_text("never copied\n")
    (context / ".dockerignore").write_text("site/*.key\n")
    (context / "Dockerfile").write_text(DOCKERFILE)
    name = f"cli-df-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CRYOBOX_API_URL": server.url, "CRYOBOX_API_KEY": server.api_key}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cryobox.cli.main", "template", "build", "-f", str(context / "Dockerfile"),
             "--name", name, "--build-arg", "FLAVOUR=spicy", str(context)],
            env=env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "RUN" in done.stdout + done.stderr  # the live log reached the terminal
        with Sandbox.create(template=name, api_url=server.url, api_key=server.api_key) as sbx:
            page = sbx.exec(
                'python3 -c "import urllib.request as u; '
                "print(u.urlopen('http://127.0.0.1:8080/').read().decode(), end='')\""
            )
            assert page.stdout == "<h1>built</h1>\n", page
            probe = sbx.exec('pwd; echo "$MODE $FLAVOUR"; cat flavour.txt; ls')
            assert probe.stdout.splitlines() == [
                "/srv/site",
                "served spicy",
                "flavour spicy",
                "flavour.txt",
                "index.html",
            ]
    finally:
        delete(server, name)


def test_the_sdk_builds_from_an_image_on_a_loopback_registry(
    server: ServeProcess, oci_registry: OciRegistry, tmp_path: Path
) -> None:
    writer = LayoutWriter(tmp_path / "layout")
    files: dict[str, bytes | Link] = {"bin/busybox": BUSYBOX.read_bytes()}
    files.update({f"bin/{applet}": Link("busybox") for applet in ("sh", "cat", "echo")})
    files["etc/motd"] = b"from the registry\n"
    writer.tag("2", writer.image([files], Env=["PATH=/bin"], Cmd=["/bin/sh", "-c", "sleep 100000"]))
    push_layout(oci_registry, tmp_path / "layout", "2", "motd:2")
    name = f"sdk-img-{uuid.uuid4().hex[:8]}"
    try:
        with Templates(api_url=server.url, api_key=server.api_key) as templates:
            build = templates.build_from_image(name, f"{oci_registry.host}/motd:2")
            lines: list[str] = []
            final = build.wait(on_log=lambda line: lines.append(line.message))
        assert final.status == "done", lines[-20:]
        assert any("pulled" in line for line in lines), lines
        with Sandbox.create(template=name, api_url=server.url, api_key=server.api_key) as sbx:
            assert sbx.exec("cat /etc/motd").stdout == "from the registry\n"
            # the image's CMD is its start command, running since the bake
            procs = sbx.exec("for p in /proc/[0-9]*; do cat $p/cmdline; echo; done").stdout
            assert "sleep100000" in procs.replace("\x00", ""), procs
    finally:
        delete(server, name)


def test_pandastack_sdk_builds_a_dockerfile_and_creates_from_it(server: ServeProcess, tmp_path: Path) -> None:
    client = pandastack.Client(api_url=server.url, api_key=server.api_key, timeout=30, max_create_retry_seconds=0)
    context = tmp_path / "ctx"
    (context / "conf" / "deep").mkdir(parents=True)
    (context / "conf" / "deep" / "app.ini").write_text("[app]\nok=1\n")
    name = f"ps-df-{uuid.uuid4().hex[:8]}"
    try:
        build = client.templates.build_from_dockerfile(
            name,
            "FROM debian:bookworm\nCOPY conf /etc/app\nRUN test -f /etc/app/deep/app.ini\n",
            context_dir=str(context),
        )
        final = client.templates.wait_for_build(build.id, poll_interval=1, timeout_seconds=1200)
        assert final.status == "done"
        pandastack.set_default_client(client)
        sbx = pandastack.Sandbox.create(template=name)
        try:
            assert sbx.exec("cat /etc/app/deep/app.ini").stdout == "[app]\nok=1\n"
        finally:
            sbx.kill()
    finally:
        delete(server, name)
