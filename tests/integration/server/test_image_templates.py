"""Any image boots: templates built from OCI images on a loopback registry — one that is only a static busybox
(no Python, no libc) and a musl-only one (built here with Debian's musl-tools) — create, exec with the image's ENV,
WORKDIR and USER, read and write files, snapshot and restore, fork, hibernate and wake like ``base``. The guest
agent runs from the agent disk; nothing of it comes from the image. Built through E2B's template API
(``fromImage``), as an SDK's ``Template().from_image(ref)`` sends it."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from tests.support import oci_registry as oci_registry_support
from tests.support.oci import BUSYBOX, Files, LayoutWriter, Link
from tests.support.oci_registry import OciRegistry, push_layout

oci_registry = oci_registry_support.oci_registry
APPLETS = ("sh", "echo", "id", "pwd", "cat", "ls", "env", "sleep", "true")
MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")


def busybox_root() -> dict[str, bytes | Link]:
    files: dict[str, bytes | Link] = {"bin/busybox": BUSYBOX.read_bytes()}
    files.update({f"bin/{applet}": Link("busybox") for applet in APPLETS})
    return files


def musl_root(tmp: Path) -> Files:
    source = tmp / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hello from musl"); return 0; }\n')
    binary = tmp / "hello"
    subprocess.run(["musl-gcc", "-O2", "-o", str(binary), str(source)], check=True)
    return {**busybox_root(), "lib/ld-musl-x86_64.so.1": MUSL_LOADER.read_bytes(), "bin/hello": binary.read_bytes()}


def build_from_image(server: ServeProcess, ref: str, name: str, timeout_s: float = 900) -> dict[str, Any]:
    e2b = f"{server.url}/e2b"
    headers = {"X-API-Key": server.api_key}
    made = httpx.post(f"{e2b}/v3/templates", json={"name": name, "cpuCount": 1, "memoryMB": 256}, headers=headers)
    assert made.status_code == 202, made.text
    template_id, build_id = made.json()["templateID"], made.json()["buildID"]
    body = {"fromImage": ref, "steps": [], "force": False}
    started = httpx.post(f"{e2b}/v2/templates/{template_id}/builds/{build_id}", json=body, headers=headers)
    assert started.status_code == 202, started.text
    deadline = time.monotonic() + timeout_s
    logs: list[str] = []
    while time.monotonic() < deadline:
        status = httpx.get(
            f"{e2b}/templates/{template_id}/builds/{build_id}/status",
            params={"logsOffset": len(logs)},
            headers=headers,
        ).json()
        logs += [entry["message"] for entry in status["logEntries"]]
        if status["status"] in ("ready", "error"):
            return {**status, "logs": logs}
        time.sleep(1)
    raise AssertionError(f"{name} still building: {logs[-20:]}")


@pytest.mark.parametrize("kind", ["busybox", "musl"])
def test_an_image_without_python_or_glibc_works_like_base(
    kind: str, server: ServeProcess, oci_registry: OciRegistry, tmp_path: Path
) -> None:
    files = busybox_root() if kind == "busybox" else musl_root(tmp_path)
    layout = tmp_path / "layout"
    writer = LayoutWriter(layout)
    desc = writer.image([files], Env=["PATH=/bin", "GREETING=hi from the image"], WorkingDir="/home/user", User="user")
    writer.tag("1", desc)
    push_layout(oci_registry, layout, "1", f"{kind}-only:1")
    name = f"img-{kind}-{uuid.uuid4().hex[:8]}"
    built = build_from_image(server, f"{oci_registry.host}/{kind}-only:1", name)
    try:
        assert built["status"] == "ready", built["logs"][-30:]
        with Sandbox.create(template=name, api_url=server.url, api_key=server.api_key) as sbx:
            probe = sbx.exec('echo "$GREETING"; id -un; pwd')
            assert probe.stdout.splitlines() == ["hi from the image", "user", "/home/user"], probe
            bare = sbx.exec("ls /usr/lib/python3* /lib/x86_64-linux-gnu/libc.so.6 2>&1; echo end")
            assert "No such file" in bare.stdout  # the image has neither: the agent brought its own
            if kind == "musl":
                assert sbx.exec("/bin/hello").stdout == "hello from musl\n"
            sbx.filesystem.write("/home/user/note.txt", "kept\n")
            assert sbx.filesystem.read_text("/home/user/note.txt") == "kept\n"
            snap = sbx.snapshot()
            with Sandbox.create(from_snapshot=snap.id, api_url=server.url, api_key=server.api_key) as restored:
                assert restored.exec("cat note.txt").stdout == "kept\n"
            child = sbx.fork()
            try:
                assert child.exec("cat /home/user/note.txt; id -un").stdout == "kept\nuser\n"
            finally:
                child.kill()
            sbx.hibernate()
            sbx.wake()
            assert sbx.exec("cat note.txt").stdout == "kept\n"
    finally:
        httpx.delete(f"{server.url}/v1/templates/{name}", headers={"Authorization": f"Bearer {server.api_key}"})


def test_a_hostile_layer_fails_the_build_naming_its_member_and_leaves_nothing(
    server: ServeProcess, oci_registry: OciRegistry, tmp_path: Path
) -> None:
    """A layer member climbing out with ``..`` is refused by the build VM's extractor (the host never unpacks);
    the build ends in ``base`` naming it, no template is listed and no build VM is left (the session's leak check).
    The other hostile cases (absolute and relative symlink escapes, hard links out, device nodes, setuid) are the
    extractor's unit tests (tests/unit/guest/build/test_layers.py)."""
    writer = LayoutWriter(tmp_path / "layout")
    writer.tag("1", writer.image([{**busybox_root(), "../../escape": b"out\n"}]))
    push_layout(oci_registry, tmp_path / "layout", "1", "hostile:1")
    name = f"img-hostile-{uuid.uuid4().hex[:8]}"
    built = build_from_image(server, f"{oci_registry.host}/hostile:1", name)
    assert built["status"] == "error", built["logs"][-20:]
    assert built["reason"]["step"] == "base", built["reason"]
    assert "escape" in built["reason"]["message"] + "".join(built["logs"]), built
    listed = httpx.get(f"{server.url}/v1/templates", headers={"Authorization": f"Bearer {server.api_key}"}).json()
    assert name not in [t["name"] for t in listed["items"]]
