"""Guest filesystem routes."""

from __future__ import annotations

import os

import httpx
import pytest

from cryobox import NotFound, PayloadTooLarge, Sandbox
from cryobox.bench.server import ServeProcess


def test_binary_round_trip_with_parents_created(sandbox: Sandbox) -> None:
    data = bytes(range(256)) * 4096 + os.urandom(1 << 20)
    assert sandbox.filesystem.write("/work/deep/dir/blob.bin", data) == len(data)
    assert sandbox.filesystem.read("/work/deep/dir/blob.bin") == data
    digest = sandbox.exec("sha256sum /work/deep/dir/blob.bin").stdout.split()[0]
    import hashlib

    assert digest == hashlib.sha256(data).hexdigest()


def test_list_stat_delete(sandbox: Sandbox) -> None:
    sandbox.filesystem.write("/work/d/a.txt", "alpha")
    sandbox.filesystem.write("/work/d/sub/b.txt", b"beta!")
    entries = {e.name: e for e in sandbox.filesystem.list("/work/d")}
    assert set(entries) == {"a.txt", "sub"}
    assert entries["sub"].is_dir and not entries["a.txt"].is_dir
    assert entries["a.txt"].size == 5
    stat = sandbox.filesystem.stat("/work/d/sub/b.txt")
    assert stat.size == 5 and not stat.is_dir
    sandbox.filesystem.remove("/work/d/a.txt")
    assert not sandbox.filesystem.exists("/work/d/a.txt")
    assert sandbox.filesystem.exists("/work/d/sub/b.txt")


def test_missing_file_is_404(sandbox: Sandbox) -> None:
    with pytest.raises(NotFound):
        sandbox.filesystem.read("/does/not/exist")


def test_oversized_write_is_413_and_writes_nothing(sandbox: Sandbox) -> None:
    with pytest.raises(PayloadTooLarge):
        sandbox.filesystem.write("/work/huge.bin", b"\0" * ((64 << 20) + 1))
    assert not sandbox.filesystem.exists("/work/huge.bin")


def test_relative_path_is_400(server: ServeProcess, sandbox: Sandbox) -> None:
    response = httpx.get(
        f"{server.url}/v1/sandboxes/{sandbox.id}/fs",
        params={"path": "etc/passwd"},
        headers={"Authorization": f"Bearer {server.api_key}"},
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument"
