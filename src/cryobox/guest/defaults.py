"""The image's exec defaults: ``/etc/cryobox/defaults.json``, written into an image by a recipe build.

The file (optional; JSON object, every key optional)::

    {
      "env":     {"NAME": "value", ...},   # a Dockerfile's ENV: under every process the agent starts
      "workdir": "/abs/dir",               # its WORKDIR: the cwd of a process whose request names none
      "user":    "name"                    # its USER: who runs a process whose request names no user
    }

How a request meets them (:mod:`.launch`): the request's ``user`` wins, else the file's ``user``, else the
request's ``default_user`` (the front door's own default: E2B's ``user``), else the agent's user (root). The
cwd is the request's, else the file's ``workdir``, else the user's home. The environment is the agent's, then
the file's ``env``, then the request's ``env`` (the request wins). The file is read at every launch (it is a
few bytes), so a bake's warm-up or a user may change it. A malformed file is ignored whole, with a log line.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

DEFAULTS_PATH = "/etc/cryobox/defaults.json"


@dataclass(frozen=True)
class ImageDefaults:
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None


def read_defaults(path: str = DEFAULTS_PATH) -> ImageDefaults:
    """The image's defaults from ``path``; empty when the file is absent, unreadable or malformed."""
    try:
        with open(path, "rb") as handle:
            data: Any = json.loads(handle.read())
    except FileNotFoundError:
        return ImageDefaults()
    except (OSError, ValueError) as err:
        _warn(f"{path} is not readable JSON ({err}); ignored")
        return ImageDefaults()
    if not isinstance(data, dict):
        _warn(f"{path} is not a JSON object; ignored")
        return ImageDefaults()
    env, workdir, user = data.get("env") or {}, data.get("workdir") or None, data.get("user") or None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and "=" not in k and "\x00" not in k and isinstance(v, str) and "\x00" not in v
        for k, v in env.items()
    ):
        _warn(f"{path}: 'env' must map variable names to strings; ignored")
        return ImageDefaults()
    if workdir is not None and (not isinstance(workdir, str) or not os.path.isabs(workdir) or "\x00" in workdir):
        _warn(f"{path}: 'workdir' must be an absolute path; ignored")
        return ImageDefaults()
    if user is not None and (not isinstance(user, str) or "\x00" in user):
        _warn(f"{path}: 'user' must be a user name; ignored")
        return ImageDefaults()
    return ImageDefaults(env=dict(env), workdir=workdir, user=user)


def _warn(message: str) -> None:
    print(f"cryobox-guest[{os.getpid()}]: {message}", file=sys.stderr, flush=True)
