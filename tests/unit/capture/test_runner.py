"""``cryobox capture`` without VMs: the runner's decisions with a fake sandbox, the upload tarball, the pytest
plugin's argument handling, and the SDK's evidence calls over an httpx.MockTransport (sync and async)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox import models
from cryobox.capture import plugin
from cryobox.capture.runner import (
    EXIT_PATH,
    FAILURE_PATH,
    INNER_ENV,
    LOG_PATH,
    PID_PATH,
    CaptureOptions,
    CaptureRunner,
    build_tarball,
    detached_command,
    provenance_labels,
)
from cryobox.cli.capture_cmds import join_command
from cryobox.sdk import ExecResult
from tests.support.clock import FakeClock
from tests.support.sdk import INFO, SNAP, MockApi, resolve, route

NOW = datetime(2024, 5, 1, 12, 30, 5, tzinfo=UTC)


class FakeFiles:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def write(self, path: str, data: str | bytes) -> int:
        self.files[path] = data.encode() if isinstance(data, str) else data
        return len(self.files[path])

    def read(self, path: str) -> bytes:
        return self.files[path]


@dataclass
class FakeSandbox:
    """A guest whose test ends with ``exit_code`` after ``runs_s`` seconds of the fake clock (``None``: never)."""

    clock: FakeClock
    exit_code: int | None
    runs_s: float = 3.0
    setup_exit: int = 0
    id: str = "sbx_0123"
    info: models.Sandbox = field(default_factory=lambda: models.Sandbox.model_validate({**INFO, "host": "host-a"}))
    filesystem: FakeFiles = field(default_factory=FakeFiles)
    execs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    snapshots: list[tuple[dict[str, str], bool, bytes | None]] = field(default_factory=list)
    killed: bool = False
    closed: bool = False
    started_at: float | None = None

    def exec(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        self.execs.append((cmd, {"env": dict(env or {}), "cwd": cwd, "timeout": timeout_seconds}))
        if cmd.startswith("mkdir -p /work && tar -xzf"):
            return ExecResult("", "", 0, 1.0)
        if "setsid" in cmd:
            self.started_at = self.clock.now
            self.filesystem.write(PID_PATH, b"4242\n")
            self.filesystem.write(LOG_PATH, b"test output\n")
            return ExecResult("", "", 0, 1.0)
        if EXIT_PATH in cmd:  # the wait (or the last look): time passes in the guest
            assert self.started_at is not None
            end = self.started_at + self.runs_s if self.exit_code is not None else float("inf")
            waited = timeout_seconds - 30 if timeout_seconds and "while" in cmd else 0.0
            if self.clock.now + waited >= end:
                self.clock.now = max(self.clock.now, end)
                self.filesystem.write(EXIT_PATH, f"{self.exit_code}\n".encode())
                return ExecResult("", "", 0, 1.0)
            self.clock.now += waited
            return ExecResult("", "", 1, 1.0)
        return ExecResult("", "setup says no", self.setup_exit, 1.0)

    def snapshot(self, labels: Mapping[str, str] | None = None, *, retain: bool = False) -> models.Snapshot:
        self.snapshots.append((dict(labels or {}), retain, self.filesystem.files.get(FAILURE_PATH)))
        return models.Snapshot("snp_9", self.id, "base", 1, NOW, dict(labels or {}), retain)

    def kill(self) -> None:
        self.killed = True

    def close(self) -> None:
        self.closed = True


@dataclass
class Harness:
    sandbox: FakeSandbox
    evidence: list[tuple[str, str, bytes]] = field(default_factory=list)
    created: list[tuple[str, int]] = field(default_factory=list)

    def runner(self) -> CaptureRunner:
        def create(template: str, ttl: int) -> FakeSandbox:
            self.created.append((template, ttl))
            return self.sandbox

        def put(snapshot_id: str, name: str, data: bytes) -> int:
            self.evidence.append((snapshot_id, name, data))
            return len(data)

        return CaptureRunner(create, put, api_url="http://api.example:8080", clock=self.sandbox.clock, now=lambda: NOW)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / "node_modules" / "x").mkdir(parents=True)
    (root / "test_a.py").write_text("def test(): pass\n")
    return root


def options(root: Path, **overrides: Any) -> CaptureOptions:
    base: dict[str, Any] = {"template": "base", "command": "python3 -m pytest", "upload": root, "seed": 7}
    return CaptureOptions(**{**base, **overrides, "timeout_s": overrides.get("timeout_s", 60.0)})


# --- decisions -----------------------------------------------------------------------------------------------------


def test_green_kills_and_keeps_nothing(tmp_path: Path) -> None:
    h = Harness(FakeSandbox(FakeClock(1000.0), exit_code=0))
    result = h.runner().run(options(project(tmp_path), ttl_s=900))
    assert result.outcome == "passed" and result.exit_status == 0 and result.snapshot_id is None
    assert h.created == [("base", 900)]
    assert h.sandbox.killed and not h.sandbox.snapshots and not h.evidence
    assert FAILURE_PATH not in h.sandbox.filesystem.files
    assert result.log == b"test output\n"
    assert result.to_json()["outcome"] == "passed"


def test_red_writes_provenance_snapshots_retained_and_keeps_the_sandbox(tmp_path: Path) -> None:
    h = Harness(FakeSandbox(FakeClock(1000.0), exit_code=3))
    result = h.runner().run(options(project(tmp_path)))
    sbx = h.sandbox
    assert result.outcome == "failed" and result.exit_code == 3 and result.exit_status == 3
    assert not sbx.killed and sbx.closed
    ((labels, retain, failure_at_snapshot),) = sbx.snapshots
    assert retain
    assert failure_at_snapshot is not None  # written before the snapshot, so a restore has it
    failure = json.loads(failure_at_snapshot)
    assert {"commit", "seed", "command", "exit_code", "captured_at", "host", "template", "pid", "kind"} <= set(failure)
    assert failure["kind"] == "failure" and failure["exit_code"] == 3 and failure["seed"] == 7
    assert failure["captured_at"] == "2024-05-01T12:30:05Z" and failure["host"] == "host-a"
    assert failure["pid"] == 4242 and failure["template"] == "base" and failure["command"] == "python3 -m pytest"
    assert labels["cryobox.capture"] == "failure" and labels["exit_code"] == "3" and labels["seed"] == "7"
    assert all(isinstance(v, str) for v in labels.values())
    assert ("snp_9", "test.log", b"test output\n") in h.evidence
    assert result.snapshot_id == "snp_9" and result.to_json()["snapshot_id"] == "snp_9"


def test_hang_snapshots_the_running_test_with_null_exit_code(tmp_path: Path) -> None:
    h = Harness(FakeSandbox(FakeClock(1000.0), exit_code=None))
    result = h.runner().run(options(project(tmp_path), timeout_s=25.0, seed=None))
    sbx = h.sandbox
    assert result.outcome == "hang" and result.exit_code is None and result.exit_status == 124
    assert sbx.clock.now >= 1000.0 + 25.0
    ((labels, retain, failure_json),) = sbx.snapshots
    assert failure_json is not None
    failure = json.loads(failure_json)
    assert failure["exit_code"] is None and failure["kind"] == "hang" and failure["seed"] is None
    assert labels["cryobox.capture"] == "hang" and "exit_code" not in labels and "seed" not in labels
    assert retain and not sbx.killed and sbx.closed
    assert [name for _, name, _ in h.evidence] == ["test.log", "failure.json"]


def test_setup_failure_kills_and_reports(tmp_path: Path) -> None:
    h = Harness(FakeSandbox(FakeClock(1000.0), exit_code=0, setup_exit=5))
    result = h.runner().run(options(project(tmp_path), setup="pip install nope"))
    assert result.outcome == "setup_failed" and result.exit_status == 3 and result.exit_code == 5
    assert h.sandbox.killed and not h.sandbox.snapshots
    assert "setup says no" in result.setup_output
    assert not any("setsid" in cmd for cmd, _ in h.sandbox.execs)


def test_test_runs_detached_in_work_with_seed_and_inner_env(tmp_path: Path) -> None:
    h = Harness(FakeSandbox(FakeClock(1000.0), exit_code=0))
    h.runner().run(options(project(tmp_path)))
    (start,) = [(cmd, kw) for cmd, kw in h.sandbox.execs if "setsid" in cmd]
    cmd, kw = start
    assert kw["cwd"] == "/work" and kw["env"] == {"CRYOBOX_SEED": "7", INNER_ENV: "1"}
    assert cmd.rstrip().endswith("&")
    assert h.sandbox.filesystem.files["/work/.cryobox/upload.tar.gz"][:2] == b"\x1f\x8b"


def test_detached_command_shape() -> None:
    cmd = detached_command("python3 -c 'print(1)'")
    assert cmd.startswith("mkdir -p /work/.cryobox && setsid sh -c ")
    assert "/work/.cryobox/test.log" in cmd and "/work/.cryobox/pid" in cmd and "/work/.cryobox/exit_code" in cmd


def test_labels_are_strings_without_nulls() -> None:
    labels = provenance_labels({"kind": "hang", "exit_code": None, "seed": 3, "command": "x" * 5000})
    assert labels == {"cryobox.capture": "hang", "kind": "hang", "seed": "3", "command": "x" * 1024}


# --- the upload ----------------------------------------------------------------------------------------------------


def test_tarball_excludes_vcs_venv_caches(tmp_path: Path) -> None:
    data = build_tarball(project(tmp_path))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert {"pkg", "pkg/mod.py", "test_a.py"} <= names
    assert not any(part in {".git", ".venv", "__pycache__", "node_modules"} for n in names for part in n.split("/"))


def test_join_command() -> None:
    assert join_command(["python3", "a b.py"]) == "python3 'a b.py'"
    assert join_command(["make test && echo ok"]) == "make test && echo ok"


# --- the pytest plugin ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-p", "cryobox.capture", "--cryobox-template", "T", "tests/x.py"], ["tests/x.py"]),
        (["-pcryobox.capture", "--cryobox-template=T", "--cryobox-timeout", "5", "-q", "-k", "a"], ["-q", "-k", "a"]),
        (
            ["--cryobox-upload=.", "-p", "no:cacheprovider", "--cryobox-ttl", "60", "-x"],
            ["-p", "no:cacheprovider", "-x"],
        ),
        (["--cryobox-setup", "pip install -e .", "t.py::test_a"], ["t.py::test_a"]),
    ],
)
def test_strip_plugin_args(args: list[str], expected: list[str]) -> None:
    assert plugin.strip_plugin_args(args) == expected


def test_guest_args_relative_to_upload_root(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_x.py").write_text("")
    args = [str(tmp_path / "sub" / "test_x.py") + "::test_a", "-k", "x", "test_x.py", "/elsewhere.py"]
    got = plugin.guest_args(args, tmp_path / "sub", tmp_path)
    assert got == ["sub/test_x.py::test_a", "-k", "x", "sub/test_x.py", "/elsewhere.py"]


def test_plugin_is_a_no_op_without_template_or_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    class Opt:
        help = False
        version = False

    class Config:
        option = Opt()

        def getoption(self, name: str) -> Any:
            return "base" if name == "cryobox_template" else None

        def getini(self, name: str) -> Any:
            return ""

    monkeypatch.setenv(INNER_ENV, "1")
    assert plugin.pytest_cmdline_main(Config()) is None  # type: ignore[arg-type]


# --- SDK evidence --------------------------------------------------------------------------------------------------


@pytest.fixture(params=["sync", "async"])
async def sdk(request: pytest.FixtureRequest) -> AsyncIterator[MockApi]:
    harness = MockApi(request.param)
    yield harness
    await harness.close()


async def test_sdk_evidence_calls(sdk: MockApi) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/evidence"):
            return httpx.Response(200, json={"files": [{"name": "console.log", "size": 3}]})
        if request.method == "GET":
            return httpx.Response(200, content=b"abc")
        return httpx.Response(200, json={"name": "test.log", "size": len(request.content)})

    snapshots, rec = sdk.snapshots(handler)
    assert await resolve(snapshots.evidence("snp_1")) == [{"name": "console.log", "size": 3}]
    assert await resolve(snapshots.get_evidence("snp_1", "console.log")) == b"abc"
    assert await resolve(snapshots.put_evidence("snp_1", "test.log", "héllo")) == len("héllo".encode())
    routes = [route(r) for r in rec.requests]
    assert routes == [
        ("GET", "/v1/snapshots/snp_1/evidence"),
        ("GET", "/v1/snapshots/snp_1/evidence/console.log"),
        ("PUT", "/v1/snapshots/snp_1/evidence/test.log"),
    ]
    assert rec.requests[2].content == "héllo".encode()
    assert rec.requests[2].headers["content-type"] == "application/octet-stream"
    assert SNAP["id"] == "snp_0001"
