"""The driver's command line: ``python3 -m cryobox_guest.build <command> [json]``, one command per call.

Exit status: 0 success; a ``RUN`` step's own status when its command fails (128 + signal when killed, 127 when it
could not start); :data:`EXIT_USAGE` for an unknown command or bad json; :data:`EXIT_REFUSED` when a build input or
step is refused or cannot be carried out; :data:`EXIT_INTERNAL` for a driver bug. Progress lines go to stdout,
prefixed ``cryobox-build:``; on failure the last line on stderr says why, prefixed ``cryobox-build: error:``.
``CRYOBOX_BUILD_DIR`` moves the driver's directory (default ``/run/cryobox-build``; tests).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .accounts import ensure_user
from .errors import BuildError
from .layers import Limits, unpack
from .session import BUILD_DIR, Layout, finish, freeze, prepare, thaw
from .steps import do_step

EXIT_USAGE = 64
EXIT_REFUSED = 65
EXIT_INTERNAL = 70
COMMANDS = ("prepare", "unpack", "ensure-user", "step", "freeze", "thaw", "finish")


def log(message: str) -> None:
    print(f"cryobox-build: {message}", flush=True)


def fail(message: str) -> None:
    sys.stdout.flush()
    print(f"cryobox-build: error: {message}", file=sys.stderr, flush=True)


def dispatch(command: str, payload: dict[str, Any], layout: Layout, emit: Callable[[str], None] = log) -> int:
    """Run one command; its exit status. :raises BuildError: refused."""
    if command == "prepare":
        prepare(layout, payload, emit)
    elif command == "unpack":
        unpack(layout.target, layout.layers, Limits.from_json(payload), emit)
    elif command == "ensure-user":
        ensure_user(layout.target, emit)
    elif command == "step":
        status = do_step(layout.target, layout.contexts, layout.state_dir, payload, emit)
        if status != 0:
            fail(f"RUN exited with status {status}")
        return status
    elif command == "freeze":
        freeze(layout, emit)
    elif command == "thaw":
        thaw(layout, emit)
    elif command == "finish":
        finish(layout, emit)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS or len(args) > 2:
        fail(f"usage: python3 -m cryobox_guest.build {{{'|'.join(COMMANDS)}}} [json]")
        return EXIT_USAGE
    try:
        payload = json.loads(args[1]) if len(args) == 2 else {}
    except json.JSONDecodeError as err:
        fail(f"{args[0]}: invalid json: {err}")
        return EXIT_USAGE
    if not isinstance(payload, dict):
        fail(f"{args[0]}: the json must be an object")
        return EXIT_USAGE
    layout = Layout(os.environ.get("CRYOBOX_BUILD_DIR", BUILD_DIR))
    try:
        return dispatch(args[0], payload, layout)
    except BuildError as err:
        fail(str(err))
        return EXIT_REFUSED
    except Exception as err:  # a driver bug: the traceback for the log, then the one-line reason
        traceback.print_exc()
        fail(f"{args[0]}: internal error: {err!r}")
        return EXIT_INTERNAL


__all__ = ["COMMANDS", "EXIT_INTERNAL", "EXIT_REFUSED", "EXIT_USAGE", "dispatch", "main"]
