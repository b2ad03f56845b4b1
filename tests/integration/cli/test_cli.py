"""The ``cryobox`` command line against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from cryobox.bench.server import ServeProcess


def cli(server: ServeProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **server.env(), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cryobox.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=300,
    )


def test_sandbox_commands_end_to_end(server: ServeProcess, tmp_path: Path) -> None:
    created = cli(server, "sandbox", "create", "--template", "base", "-m", "via=cli", "--json")
    assert created.returncode == 0, created.stderr
    info = json.loads(created.stdout)
    sandbox_id = info["id"]
    try:
        assert info["boot_mode"] == "restore" and info["metadata"] == {"via": "cli"}
        listed = json.loads(cli(server, "sandbox", "list", "--json").stdout)
        assert sandbox_id in [s["id"] for s in listed]
        got = json.loads(cli(server, "sandbox", "get", sandbox_id, "--json").stdout)
        assert got["status"] == "running"

        streamed = cli(server, "sandbox", "exec", sandbox_id, "echo out; echo err >&2; exit 7")
        assert streamed.returncode == 7
        assert streamed.stdout == "out\n" and "err" in streamed.stderr
        result = json.loads(cli(server, "sandbox", "exec", sandbox_id, "--json", "uname -s").stdout)
        assert result["stdout"] == "Linux\n" and result["exit_code"] == 0

        local = tmp_path / "in.bin"
        local.write_bytes(os.urandom(100_000))
        assert cli(server, "sandbox", "cp", str(local), f"{sandbox_id}:/work/in.bin").returncode == 0
        back = tmp_path / "back.bin"
        assert cli(server, "sandbox", "cp", f"{sandbox_id}:/work/in.bin", str(back)).returncode == 0
        assert back.read_bytes() == local.read_bytes()

        templates = json.loads(cli(server, "template", "list", "--json").stdout)
        assert {"base", "code-interpreter"} <= {t["name"] for t in templates}
    finally:
        killed = cli(server, "sandbox", "kill", sandbox_id)
    assert killed.returncode == 0
    missing = cli(server, "sandbox", "get", sandbox_id)
    assert missing.returncode == 2 and "not_found" in missing.stderr


def test_volume_cp_copies_both_ways_without_a_sandbox_of_yours(server: ServeProcess, tmp_path: Path) -> None:
    name = f"cp-{os.urandom(4).hex()}"
    assert cli(server, "volume", "create", name, "--size-mb", "64").returncode == 0
    try:
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("alpha\n")
        (src / "sub" / "b.bin").write_bytes(bytes(range(256)) * 16)
        (src / "link").symlink_to("/etc/passwd")  # skipped: never followed
        up = cli(server, "volume", "cp", str(src), f"{name}:/data", "--json")
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout) == {"files": 2, "bytes": 6 + 4096, "dirs": 2, "skipped": [str(src / "link")]}
        listed = httpx.get(
            f"{server.url}/v1/volumes/{name}/entries",
            params={"path": "/", "depth": 4},
            headers={"Authorization": f"Bearer {server.api_key}"},
            timeout=120,
        ).json()["items"]
        assert [(e["path"], e["type"]) for e in listed] == [
            ("/data", "directory"), ("/data/a.txt", "file"), ("/data/sub", "directory"), ("/data/sub/b.bin", "file"),
            ("/lost+found", "directory"),
        ]  # fmt: skip
        down = cli(server, "volume", "cp", f"{name}:/data", str(tmp_path / "back"))
        assert down.returncode == 0, down.stderr
        assert (tmp_path / "back" / "a.txt").read_text() == "alpha\n"
        assert (tmp_path / "back" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 16
        one = cli(server, "volume", "cp", f"{name}:/data/a.txt", str(tmp_path))
        assert one.returncode == 0 and (tmp_path / "a.txt").read_text() == "alpha\n", one.stderr
        missing = cli(server, "volume", "cp", f"{name}:/nope", str(tmp_path))
        assert missing.returncode != 0 and "not_found" in missing.stderr, missing.stderr
    finally:
        cli(server, "volume", "rm", name)
    assert cli(server, "volume", "get", name).returncode != 0
