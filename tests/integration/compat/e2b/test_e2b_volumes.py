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
