"""The build session's own commands: ``prepare`` (mount the disks), ``freeze`` / ``thaw`` (the host snapshots the
target disk between them) and ``finish`` (clean up and unmount). Paths are a :class:`Layout` so tests run it all
in a temporary directory."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import BuildError
from .mounts import Runner, is_mount_point, run_command, unmount_under
from .step_run import cleanup

Log = Callable[[str], None]
Ioctl = Callable[[int, int], None]
BUILD_DIR = "/run/cryobox-build"
FIFREEZE = 0xC0045877  # _IOWR('X', 119, int)
FITHAW = 0xC0045878  # _IOWR('X', 120, int)


@dataclass(frozen=True)
class Layout:
    """Where the driver keeps things in the build VM (never inside the target)."""

    base: str = BUILD_DIR

    @property
    def inputs(self) -> str:
        return os.path.join(self.base, "inputs")

    @property
    def target(self) -> str:
        return os.path.join(self.base, "target")

    @property
    def state_dir(self) -> str:
        return os.path.join(self.base, "state")

    @property
    def layers(self) -> str:
        return os.path.join(self.inputs, "layers")

    @property
    def contexts(self) -> str:
        return os.path.join(self.inputs, "contexts")

    @property
    def session_file(self) -> str:
        return os.path.join(self.state_dir, "session.json")


def _device(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value.startswith("/dev/"):
        raise BuildError(f"prepare: {key!r} must be a device path under /dev, got {value!r}")
    return value


def prepare(layout: Layout, payload: dict[str, Any], log: Log, runner: Runner = run_command) -> None:
    """Mount the inputs disk read-only and the target read-write (private, so nothing mounted under it later
    propagates); already mounted ones are left as they are."""
    target_dev, inputs_dev = _device(payload, "target"), _device(payload, "inputs")
    fresh = bool(payload.get("fresh", False))
    for path in (layout.inputs, layout.target, layout.state_dir):
        os.makedirs(path, 0o700, exist_ok=True)
    if not is_mount_point(layout.inputs):
        runner(["mount", "-t", "ext4", "-o", "ro,noload,nodev,nosuid", inputs_dev, layout.inputs])
    if not is_mount_point(layout.target):
        runner(["mount", "-t", "ext4", "-o", "noatime", target_dev, layout.target])
    runner(["mount", "--make-private", layout.target])
    with open(layout.session_file, "w") as handle:
        json.dump({"target": target_dev, "inputs": inputs_dev, "fresh": fresh}, handle)
    origin = "fresh" if fresh else "from a parent image"
    log(f"prepared: {target_dev} at {layout.target} ({origin}), inputs {inputs_dev}")


def _fs_ioctl(path: str, request: int, ioctl: Ioctl) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ioctl(fd, request)
    finally:
        os.close(fd)


def _ioctl(fd: int, request: int) -> None:
    fcntl.ioctl(fd, request, 0)


def freeze(layout: Layout, log: Log, ioctl: Ioctl = _ioctl) -> None:
    """sync, then FIFREEZE the target's file system (writes block until :func:`thaw`)."""
    os.sync()
    try:
        _fs_ioctl(layout.target, FIFREEZE, ioctl)
    except OSError as err:
        raise BuildError(f"freeze {layout.target}: {err.strerror or err}") from err
    log(f"frozen: {layout.target}")


def thaw(layout: Layout, log: Log, ioctl: Ioctl = _ioctl) -> None:
    """FITHAW the target's file system; one that is not frozen is fine (a retried thaw)."""
    os.sync()
    try:
        _fs_ioctl(layout.target, FITHAW, ioctl)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise BuildError(f"thaw {layout.target}: {err.strerror or err}") from err
        log(f"thaw: {layout.target} was not frozen")
        return
    log(f"thawed: {layout.target}")


def finish(layout: Layout, log: Log, runner: Runner = run_command, unmount: bool = True) -> None:
    """Undo what steps left (processes, mounts, swapped files), sync, unmount the target and the inputs."""
    if os.path.isdir(layout.target):
        cleanup(layout.target, layout.state_dir, log, runner)
    os.sync()
    if unmount:
        unmount_under(layout.target, runner, include_self=True)
        unmount_under(layout.inputs, runner, include_self=True)
    log("finished: target and inputs unmounted" if unmount else "finished")


__all__ = ["BUILD_DIR", "FIFREEZE", "FITHAW", "Layout", "finish", "freeze", "prepare", "thaw"]
