"""Who runs a user process, where and with what environment: a request's fields over the image's defaults.

One function for ``exec``, ``proc_start`` and ``pty_open`` (:func:`launch_context`), so the three agree. The
request fields: ``user`` (run as this account), ``default_user`` (the front door's default, used only when
neither the request nor the image names a user), ``cwd`` and ``env``; the image's are in :mod:`.defaults`.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

from .defaults import ImageDefaults, read_defaults
from .ops_files import OpError, invalid

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/root"
SHELL = "/bin/sh"


@dataclass(frozen=True)
class LaunchContext:
    user: pwd.struct_passwd | None  # None: the agent's own account (root)
    env: dict[str, str]  # the full environment
    given_env: dict[str, str]  # only what the request gave
    cwd: str

    def ids(self) -> dict[str, Any]:
        """``subprocess.Popen`` keywords that switch to :attr:`user` (none for the agent's own account)."""
        user = self.user
        if user is None:
            return {}
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": os.getgrouplist(user.pw_name, user.pw_gid)}


def checked_env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in value.items()
    ):
        raise invalid("'env' must map variable names to strings")
    return dict(value)


def checked_cwd(cwd: Any, home: str) -> str:
    """A request's ``cwd``: an existing absolute directory, or (``None``) ``home`` if it exists, else ``/``."""
    if cwd is None:
        return home if os.path.isdir(home) else "/"
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\x00" in cwd:
        raise invalid("'cwd' must be an absolute path or null")
    if not os.path.exists(cwd):
        raise OpError("not_found", f"cwd {cwd} does not exist")
    if not os.path.isdir(cwd):
        raise OpError("not_a_directory", f"cwd {cwd} is not a directory")
    return cwd


def find_user(name: Any, key: str = "user") -> pwd.struct_passwd | None:
    """The account ``name`` (a name, or a numeric uid as a Dockerfile's ``USER`` may give); None for None."""
    if name is None:
        return None
    if not isinstance(name, str) or not name or "\x00" in name:
        raise invalid(f"{key!r} must be a user name or null")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if name.isdigit():
        try:
            return pwd.getpwuid(int(name))
        except KeyError:
            pass
    raise invalid(f"no user {name!r}")


def launch_context(args: dict[str, Any], *, term: bool = False, defaults: ImageDefaults | None = None) -> LaunchContext:
    """The account, environment and cwd of a process a request starts (see the module docstring)."""
    found = read_defaults() if defaults is None else defaults
    given = checked_env(args.get("env"))
    if args.get("user") is not None:
        user = find_user(args.get("user"))
    elif found.user is not None:
        user = find_user(found.user)
    else:
        user = find_user(args.get("default_user"), "default_user")
    env = dict(os.environ)
    if user is not None:
        env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        home = user.pw_dir
    else:
        env.setdefault("HOME", DEFAULT_HOME)
        home = DEFAULT_HOME
    if term:
        env["TERM"] = "xterm-256color"
    env.update(found.env)
    env.update(given)
    env.setdefault("PATH", DEFAULT_PATH)
    cwd = checked_cwd(args["cwd"] if args.get("cwd") is not None else found.workdir, home)
    return LaunchContext(user=user, env=env, given_env=given, cwd=cwd)


def shell_argv(command: str, shell: str = SHELL) -> list[str]:
    """``[shell, "-c", command]``. :raises OpError: ``not_found`` when the image has no ``shell`` (a scratch
    image): a command line needs one, a program started by argv (``proc_start``) does not."""
    if not os.path.exists(shell):
        raise OpError(
            "not_found",
            f"this image has no {shell}: a shell command cannot run here; start a program by its argv instead",
        )
    return [shell, "-c", command]
