"""``RUN``: the command runs chrooted into the target, as the step's user, with the build's environment.

The driver forks; the child chroots, changes to the working directory (created, owned by root, when missing),
drops to the user (``user[:group]`` resolved in the TARGET's ``/etc/passwd`` and ``/etc/group``: supplementary
groups, then gid, then uid) and execs ``/bin/sh -c CMD`` (shell form) or the argv (exec form, ``PATH`` looked up
inside the target). Its stdout and stderr are the driver's (the host streams them as build logs). Around it:
:func:`.mounts.run_mounts` and :func:`.overlays.overlaid` (resolv.conf, policy-rc.d), both undone whatever happens.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from .accounts import Identity, resolve_user
from .errors import BuildError
from .mounts import RUN_TMPFS, Runner, kill_chrooted, run_command, run_mounts, unmount_under
from .overlays import overlaid, restore, run_overlays
from .paths import resolve_in_root
from .state import BuildState, StepSpec
from .writer import make_dirs

Log = Callable[[str], None]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_FAILED = 127


def run_env(state_env: Mapping[str, str], step_env: Sequence[str], home: str) -> dict[str, str]:
    """The build's ``ENV``, then the step's own ``KEY=value`` pairs, then ``HOME`` and ``PATH`` if still unset."""
    env = dict(state_env)
    for pair in step_env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BuildError(f"step env entry {pair!r} is not KEY=value")
        env[key] = value
    env.setdefault("HOME", home)
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def command_argv(step: StepSpec) -> list[str]:
    """``/bin/sh -c CMD`` for the shell form, the argv for the exec form (``args[0] == "exec"``)."""
    if step.args and step.args[0] == "exec":
        if len(step.args) < 2:
            raise BuildError(f"{step.where}: exec form without a command")
        return list(step.args[1:])
    if len(step.args) != 1:
        raise BuildError(f"{step.where}: shell form takes one command, got {len(step.args)} arguments")
    return ["/bin/sh", "-c", step.args[0]]


def _child(root: str, workdir: str, ident: Identity, argv: list[str], env: dict[str, str], out: int, err: int) -> None:
    """In the forked child: never returns."""
    try:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.chroot(root)
        os.chdir(workdir)
        os.setgroups(list(ident.groups))
        os.setgid(ident.gid)
        os.setuid(ident.uid)
        os.umask(0o022)
        os.execvpe(argv[0], argv, env)
    except BaseException as error:  # noqa: B036 - the child must never return into the driver
        with open(2, "w", closefd=False) as stream:
            stream.write(f"cryobox-build: cannot start {argv[0]!r}: {error}\n")
    finally:
        os._exit(START_FAILED)


def wait_status(pid: int) -> int:
    """The exit status of ``pid`` in shell terms (128 + the signal for a killed one)."""
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def cleanup(root: str, state_dir: str, log: Log, runner: Runner = run_command) -> None:
    """Undo what an interrupted ``RUN`` left: its processes, its mounts and its temporary files."""
    kill_chrooted(root, log)
    unmount_under(root, runner)
    restore(state_dir)


def run_step(
    root: str,
    step: StepSpec,
    state: BuildState,
    state_dir: str,
    log: Log,
    *,
    runner: Runner = run_command,
    out: int = 1,
    err: int = 2,
    vm_resolv: str = "/etc/resolv.conf",
    tmpfs: Sequence[str] = RUN_TMPFS,
) -> int:
    """Run ``step`` in ``root``; the command's exit status."""
    argv = command_argv(step)
    cleanup(root, state_dir, log, runner)
    ident = resolve_user(root, step.user or state.user)
    env = run_env(state.env, step.env, ident.home)
    workdir = state.workdir if state.workdir.startswith("/") else "/" + state.workdir
    make_dirs(root, resolve_in_root(root, workdir, follow_final=True))
    sys.stdout.flush()
    sys.stderr.flush()
    with overlaid(root, run_overlays(vm_resolv), state_dir), run_mounts(root, log, runner, tmpfs):
        pid = os.fork()
        if pid == 0:
            _child(os.path.abspath(root), workdir, ident, argv, env, out, err)
        return wait_status(pid)


__all__ = ["DEFAULT_PATH", "cleanup", "command_argv", "run_env", "run_step", "wait_status"]
