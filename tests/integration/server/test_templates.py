"""Custom templates through the API: build job with progress, workspace scoping, failure, delete."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess


def _wait_built(server: ServeProcess, name: str, headers: dict[str, str], timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    seen_progress = False
    while time.monotonic() < deadline:
        body: dict[str, Any] = httpx.get(f"{server.url}/v1/templates/{name}", headers=headers).json()
        seen_progress = seen_progress or bool(body.get("progress"))
        if body["status"] != "building":
            body["seen_progress"] = seen_progress
            return body
        time.sleep(0.5)
    raise AssertionError(f"template {name} still building after {timeout_s}s")


def test_custom_template_build_use_scope_and_delete(server: ServeProcess) -> None:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    # a nonce makes the generation new, so this is always a real bake (a bake left on disk by an earlier run
    # would finish before the second POST and make the 409 check race)
    nonce = uuid.uuid4().hex
    spec = {
        "name": "tpl-custom",
        "base": "base",
        "memory_mb": 384,
        "files": {"/etc/cryobox-motd": "hello from a custom template\n", "/etc/cryobox-nonce": nonce},
        "warmup": ["echo warmed > /root/warm.txt"],
    }
    started = httpx.post(f"{server.url}/v1/templates", json=spec, headers=headers)
    assert started.status_code == 202, started.text
    assert started.json()["status"] == "building"
    again = httpx.post(f"{server.url}/v1/templates", json=spec, headers=headers)
    assert again.status_code == 409  # already building
    built = _wait_built(server, "tpl-custom", headers)
    assert built["status"] == "ready", built
    assert built["memory_mb"] == 384 and built["generation"]
    assert "tpl-custom" in [t["name"] for t in httpx.get(f"{server.url}/v1/templates", headers=headers).json()["items"]]

    with Sandbox.create(template="tpl-custom", api_url=server.url, api_key=server.api_key) as sbx:
        assert sbx.info.boot_mode == "restore" and sbx.info.memory_mb == 384
        assert sbx.exec("cat /etc/cryobox-motd /root/warm.txt").stdout == "hello from a custom template\nwarmed\n"

    other = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cryobox.cli.main",
                "keys",
                "create",
                "--workspace",
                "tpl-other",
                "--data-dir",
                str(server.data_dir),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["key"]
    other_headers = {"Authorization": f"Bearer {other}"}
    assert httpx.get(f"{server.url}/v1/templates/tpl-custom", headers=other_headers).status_code == 404
    assert "tpl-custom" not in [
        t["name"] for t in httpx.get(f"{server.url}/v1/templates", headers=other_headers).json()["items"]
    ]
    response = httpx.post(f"{server.url}/v1/sandboxes", json={"template": "tpl-custom"}, headers=other_headers)
    assert response.status_code == 404
    taken = httpx.post(f"{server.url}/v1/templates", json={"name": "tpl-custom"}, headers=other_headers)
    assert taken.status_code == 400 and "taken" in taken.json()["error"]

    assert httpx.delete(f"{server.url}/v1/templates/base", headers=headers).status_code == 409
    bake = (server.cache_dir or Path("/var/cache/cryobox")) / "templates" / f"tpl-custom-{built['generation']}"
    assert bake.is_dir()
    assert httpx.delete(f"{server.url}/v1/templates/tpl-custom", headers=headers).status_code == 204
    assert httpx.get(f"{server.url}/v1/templates/tpl-custom", headers=headers).status_code == 404
    assert not bake.exists()  # a deleted template's bake leaves the image cache
    response = httpx.post(f"{server.url}/v1/sandboxes", json={"template": "tpl-custom"}, headers=headers)
    assert response.status_code == 404


def test_failing_template_build_reports_the_error(server: ServeProcess) -> None:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    spec = {"name": "tpl-broken", "warmup": ["echo about to fail >&2; exit 9"]}
    assert httpx.post(f"{server.url}/v1/templates", json=spec, headers=headers).status_code == 202
    built = _wait_built(server, "tpl-broken", headers)
    assert built["status"] == "error"
    assert "warm-up command failed (9)" in built["error"]
    response = httpx.post(f"{server.url}/v1/sandboxes", json={"template": "tpl-broken"}, headers=headers)
    assert response.status_code == 409
    assert httpx.delete(f"{server.url}/v1/templates/tpl-broken", headers=headers).status_code == 204


def test_invalid_template_specs_are_400(server: ServeProcess) -> None:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    for spec in (
        {"name": "Bad Name"},
        {"name": "ok", "packages": ["rm -rf /"]},
        {"name": "ok", "memory_mb": 1},
        {"name": "ok", "files": {"relative/path": "x"}},
        {"name": "ok", "base": "nope"},
    ):
        response = httpx.post(f"{server.url}/v1/templates", json=spec, headers=headers)
        assert response.status_code == 400, (spec, response.text)


def test_added_packages_install_in_a_build_vm_never_on_the_host(server: ServeProcess) -> None:
    """jq (and the libraries it needs) come in through the build VM: configured by dpkg (its scripts and
    triggers ran) under a kernel whose boot id is not the host's; the downloads do not stay in the image."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    spec = {"name": "tpl-jq", "base": "base", "packages": ["jq"], "memory_mb": 384}
    assert httpx.post(f"{server.url}/v1/templates", json=spec, headers=headers).status_code == 202
    built = _wait_built(server, "tpl-jq", headers)
    assert built["status"] == "ready", built
    host_boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    try:
        with Sandbox.create(template="tpl-jq", api_url=server.url, api_key=server.api_key) as sbx:
            assert sbx.exec("echo '{\"a\": [1, 2]}' | jq -c .a").stdout == "[1,2]\n"
            status = sbx.exec("dpkg-query -W -f '${Status}' jq libjq1 libonig5").stdout
            assert status == "install ok installed" * 3
            boots = sbx.exec("cat /var/log/cryobox-build.boot_id").stdout.split()
            baked = sbx.exec("cat /proc/sys/kernel/random/boot_id").stdout.strip()  # the bake's (restored)
            assert boots and host_boot not in boots and baked not in boots  # every dpkg run was in the build VM
            assert sbx.exec("test -e /var/cache/cryobox-build || test -e /usr/sbin/policy-rc.d").exit_code == 1
    finally:
        assert httpx.delete(f"{server.url}/v1/templates/tpl-jq", headers=headers).status_code == 204
