"""E2B's volumes, mounted, on real VMs through the unmodified SDK (``apps/e2b_volume_mount_app.py``): data written
in one sandbox is read by the next after a kill; a volume in use is not destroyed."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

from cryobox.bench.server import ServeProcess
from tests.support.e2b import e2b_env
from tests.support.paths import APPS


def test_e2b_volume_mounts_keep_data_across_sandboxes(e2b_python: Path, server: ServeProcess) -> None:
    env = e2b_env(server.url, server.api_key, server.data_dir)
    name = f"e2b-{secrets.token_hex(4)}"
    done = subprocess.run(
        [str(e2b_python), str(APPS / "e2b_volume_mount_app.py"), name], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fatal" not in report, report
    assert report["info_mounts"] == [{"name": name, "path": "/mnt/data"}], report
    assert report["read"] == "from-e2b\n"
    assert report["destroy_while_attached"] == "VolumeException"
    assert report["destroyed"] is True


def test_e2b_volume_content_api_reads_and_writes_without_a_sandbox(e2b_python: Path, server: ServeProcess) -> None:
    env = e2b_env(server.url, server.api_key, server.data_dir)
    done = subprocess.run(
        [str(e2b_python), str(APPS / "e2b_volume_content_app.py"), f"c-{secrets.token_hex(4)}"], env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fatal" not in report, report
    assert report["written"] == {
        "name": "hello.txt", "type": "file", "path": "/hello.txt", "size": 12, "mode": 0o644, "uid": 1000, "gid": 1000,
    }, report  # fmt: skip
    assert report["dir"]["type"] == "directory" and report["dir"]["path"] == "/d/e", report
    assert report["binary"]["size"] == 256 * 64 and report["binary"]["mode"] == 0o600, report
    assert report["listed"] == [
        ["/d", "directory"], ["/d/e", "directory"], ["/d/e/data.bin", "file"], ["/hello.txt", "file"],
        ["/lost+found", "directory"],  # an ext4 file system's own
    ], report  # fmt: skip
    assert report["exists"] == [True, False] and report["chmod"] == 0o640, report
    assert report["read_text"] == "from-content" and report["read_bytes"] is True, report
    assert report["read_missing"] == "VolumePathNotFoundException", report
    assert report["in_sandbox"] == "from-content600\n", report
    assert report["while_mounted"] == "VolumeException", report  # a 409: the sandbox has it mounted read-write
    assert report["after_kill"] == "from-sandbox\n", report
    assert report["removed"] is False and report["destroyed"] is True, report
