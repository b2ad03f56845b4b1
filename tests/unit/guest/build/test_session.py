"""prepare, freeze, thaw, finish and the command line, without a VM (paths injected, mount tools recorded); and once
end to end on loop devices, the way the build VM runs it."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.guest.build.commands import EXIT_REFUSED, EXIT_USAGE, main
from cryobox.guest.build.errors import BuildError
from cryobox.guest.build.mounts import mounts_under
from cryobox.guest.build.session import FIFREEZE, FITHAW, Layout, finish, freeze, prepare, thaw
from tests.support.buildtar import TarWriter
from tests.support.busyroot import busybox_root

SRC = Path(__file__).resolve().parents[4] / "src"


def test_prepare_mounts_inputs_read_only_and_the_target_private(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    layout = Layout(str(tmp_path / "b"))
    prepare(layout, {"target": "/dev/vdb", "inputs": "/dev/vdc", "fresh": True}, lambda _: None, calls.append)
    assert calls == [
        ["mount", "-t", "ext4", "-o", "ro,noload,nodev,nosuid", "/dev/vdc", layout.inputs],
        ["mount", "-t", "ext4", "-o", "noatime", "/dev/vdb", layout.target],
        ["mount", "--make-private", layout.target],
    ]
    assert json.loads(Path(layout.session_file).read_text()) == {
        "target": "/dev/vdb",
        "inputs": "/dev/vdc",
        "fresh": True,
    }
    with pytest.raises(BuildError, match="device path"):
        prepare(layout, {"target": "/etc/passwd", "inputs": "/dev/vdc"}, lambda _: None, calls.append)


def test_freeze_and_thaw_sync_and_ioctl_the_target(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path))
    os.makedirs(layout.target)
    calls: list[int] = []
    freeze(layout, lambda _: None, lambda fd, request: calls.append(request))
    thaw(layout, lambda _: None, lambda fd, request: calls.append(request))
    assert calls == [FIFREEZE, FITHAW]

    def not_frozen(fd: int, request: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    logs: list[str] = []
    thaw(layout, logs.append, not_frozen)  # a retried thaw is fine
    assert "was not frozen" in logs[0]
    with pytest.raises(BuildError, match="freeze"):
        freeze(layout, logs.append, not_frozen)


def test_finish_unmounts_what_is_left(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path))
    os.makedirs(layout.target)
    calls: list[list[str]] = []
    finish(layout, lambda _: None, calls.append)
    assert calls == []  # nothing mounted here: nothing to do


def run_cli(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CRYOBOX_BUILD_DIR": str(base), "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "cryobox.guest.build", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_usage_errors_and_a_refused_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert main(["bogus"]) == EXIT_USAGE
    assert main(["step", "{not json"]) == EXIT_USAGE
    assert main(["step", "[1]"]) == EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[-1] == "cryobox-build: error: step: the json must be an object"
    layout = Layout(str(tmp_path))
    os.makedirs(layout.target)
    TarWriter().file("../escape", b"x").write(Path(layout.layers) / "000.tar")
    done = run_cli(tmp_path, "unpack", '{"max_bytes": 1000}')
    assert done.returncode == EXIT_REFUSED
    assert done.stderr.splitlines()[-1] == "cryobox-build: error: refused tar member '../escape': '..' in its path"
    assert not (tmp_path / "escape").exists()


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two loop devices: an empty ext4 target and an inputs ext4 holding a layer and a context blob."""
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        pytest.skip("needs root and loop devices")
    staging = tmp_path / "inputs-tree"
    image = busybox_root(tmp_path / "image")
    (staging / "layers").mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-C", str(image), "-cf", str(staging / "layers" / "000.tar"), "."], check=True)
    TarWriter().file("hello.txt", b"hello\n").write(staging / "contexts" / f"{'ab' * 32}.tar.gz", gz=True)
    devices: list[str] = []
    for name, tree in (("target", None), ("inputs", staging)):
        path = tmp_path / f"{name}.ext4"
        extra = ["-d", str(tree)] if tree else []
        subprocess.run(["mkfs.ext4", "-q", "-F", *extra, str(path), "64M"], check=True)
        attached = subprocess.run(["losetup", "-f", "--show", str(path)], capture_output=True, text=True)
        if attached.returncode != 0:
            pytest.skip(f"losetup: {attached.stderr.strip()}")
        devices.append(attached.stdout.strip())
    yield devices[0], devices[1]
    for point in mounts_under(str(tmp_path), include_self=True):
        subprocess.run(["umount", "-l", point], check=False)
    for device in devices:
        subprocess.run(["losetup", "-d", device], check=False)


def test_a_whole_build_on_loop_devices(tmp_path: Path, loops: tuple[str, str]) -> None:
    base = tmp_path / "b"
    target, inputs = loops
    steps = [
        ("prepare", json.dumps({"target": target, "inputs": inputs, "fresh": True})),
        ("unpack", "{}"),
        ("ensure-user", None),
        ("step", json.dumps({"step": {"op": "COPY", "args": ["hello.txt", "/srv/"], "context": "ab" * 32}})),
        ("step", json.dumps({"step": {"op": "WORKDIR", "args": ["/srv/w"]}, "state": {"user": "user"}})),
        (
            "step",
            json.dumps({"step": {"op": "RUN", "args": ["cat /srv/hello.txt; id -un"]}, "state": {"user": "user"}}),
        ),
        ("freeze", None),
        ("thaw", None),
    ]
    outputs = []
    for command, payload in steps:
        done = run_cli(base, command, *([payload] if payload else []))
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs.append(done.stdout)
    assert "hello\nuser\n" in outputs[5]
    root = base / "target"
    assert (root / "srv" / "hello.txt").read_text() == "hello\n"
    assert os.stat(root / "srv" / "w").st_uid == 1000
    assert "user:x:1000:1000::/home/user:/bin/sh" in (root / "etc" / "passwd").read_text()
    failed = run_cli(base, "step", json.dumps({"step": {"op": "USER", "args": ["ghost"]}}))
    assert failed.returncode == EXIT_REFUSED
    assert failed.stderr.splitlines()[-1].endswith("unable to find user 'ghost' in the image's /etc/passwd")
    done = run_cli(base, "finish")
    assert done.returncode == 0, done.stderr
    assert mounts_under(str(base), include_self=True) == []
