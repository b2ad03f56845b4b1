"""``step``: one recipe step against the target. ``RUN`` and ``COPY`` have modules of their own; ``WORKDIR``
creates its directory (owned by the build's ``USER``, as BuildKit does); ``ENV`` changes nothing on disk (the host
carries the environment to later steps); ``USER`` checks that the user exists in the target."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from .accounts import resolve_user
from .errors import BuildError
from .mounts import RUN_TMPFS, Runner, run_command
from .paths import resolve_in_root
from .state import BuildState, StepSpec
from .step_copy import copy_step
from .step_run import run_step
from .writer import make_dirs

Log = Callable[[str], None]


def workdir_step(root: str, step: StepSpec, state: BuildState, log: Log) -> None:
    if len(step.args) != 1:
        raise BuildError(f"{step.where}: WORKDIR takes one path")
    path = step.args[0] if step.args[0].startswith("/") else os.path.join(state.workdir, step.args[0])
    ident = resolve_user(root, state.user)
    if make_dirs(root, resolve_in_root(root, path, follow_final=True), ident.uid, ident.gid):
        log(f"{step.where}: created {path}")


def user_step(root: str, step: StepSpec) -> None:
    if len(step.args) != 1 or not step.args[0]:
        raise BuildError(f"{step.where}: USER takes one user[:group]")
    resolve_user(root, step.args[0])


def do_step(
    root: str,
    contexts_dir: str,
    state_dir: str,
    payload: dict[str, Any],
    log: Log,
    *,
    runner: Runner = run_command,
    out: int = 1,
    err: int = 2,
    vm_resolv: str = "/etc/resolv.conf",
) -> int:
    """Carry out the step in ``payload`` (``{"step": …, "state": …}``); the exit status (a ``RUN``'s own)."""
    raw_step = payload.get("step")
    if not isinstance(raw_step, dict):
        raise BuildError('step: the json needs a "step" object')
    step = StepSpec.from_json(raw_step)
    raw_state = payload.get("state", {})
    state = BuildState.from_json(raw_state if isinstance(raw_state, dict) else {})
    if step.op == "RUN":
        tmpfs: Sequence[str] = tuple(str(p) for p in payload.get("tmpfs", RUN_TMPFS))
        return run_step(
            root, step, state, state_dir, log, runner=runner, out=out, err=err, vm_resolv=vm_resolv, tmpfs=tmpfs
        )
    if step.op == "COPY":
        copy_step(root, contexts_dir, step, state, log)
    elif step.op == "WORKDIR":
        workdir_step(root, step, state, log)
    elif step.op == "USER":
        user_step(root, step)
    return 0


__all__ = ["do_step", "user_step", "workdir_step"]
