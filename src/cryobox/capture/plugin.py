"""The pytest plugin of ``cryobox capture``: ``pytest -p cryobox.capture --cryobox-template T [args]``.

With ``--cryobox-template`` (or the ini option ``cryobox_template``) the selected tests do not run here: the
rootdir (or ``--cryobox-upload``) is uploaded to a sandbox and ``python3 -m pytest <the same args>`` runs in
``/work`` through :class:`~cryobox.capture.runner.CaptureRunner`; a failing or hung run is snapshotted. The outer
pytest prints the inner one's output and exits with its exit code (124 for a hang). Without the option the plugin
does nothing; inside the guest (``CRYOBOX_CAPTURE_INNER=1``) it does nothing either, so it never recurses.
API endpoint and key come from ``$CRYOBOX_API_URL`` / ``$CRYOBOX_API_KEY``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .runner import INNER_ENV, CaptureOptions, sdk_runner

if TYPE_CHECKING:  # pytest is a dev dependency: importing this module (cryobox.capture) must not need it
    import pytest

PLUGIN = "cryobox.capture"
# options of this plugin that take a value (stripped, with it, from the inner pytest's arguments)
VALUE_OPTIONS = ("--cryobox-template", "--cryobox-timeout", "--cryobox-upload", "--cryobox-ttl", "--cryobox-setup")


def strip_plugin_args(args: Sequence[str]) -> list[str]:
    """``args`` without ``-p cryobox.capture`` and the ``--cryobox-*`` options (both ``--opt V`` and ``--opt=V``)."""
    kept: list[str] = []
    skip_next = False
    for index, arg in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        if arg == "-p" and index + 1 < len(args) and args[index + 1] == PLUGIN:
            skip_next = True
            continue
        if arg in (f"-p{PLUGIN}", f"-p={PLUGIN}"):
            continue
        if arg in VALUE_OPTIONS:
            skip_next = True
            continue
        if arg.startswith(tuple(f"{option}=" for option in VALUE_OPTIONS)):
            continue
        kept.append(arg)
    return kept


def guest_args(args: Sequence[str], invocation_dir: Path, upload_root: Path) -> list[str]:
    """Arguments naming files under ``upload_root`` rewritten relative to it (the guest runs in ``/work``)."""
    rewritten: list[str] = []
    root = upload_root.resolve()
    for arg in args:
        path_part, sep, rest = arg.partition("::")
        if arg.startswith("-") or not path_part:
            rewritten.append(arg)
            continue
        candidate = (invocation_dir / path_part).resolve()
        if candidate.exists() and candidate.is_relative_to(root):
            relative = candidate.relative_to(root).as_posix()
            rewritten.append((relative or ".") + sep + rest)
        else:
            rewritten.append(arg)
    return rewritten


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cryobox", "run the tests in a cryobox sandbox, snapshotting a failing or hung run")
    group.addoption("--cryobox-template", default=None, help="template of the sandbox (enables the plugin)")
    group.addoption("--cryobox-timeout", type=float, default=600.0, help="seconds before the run counts as hung")
    group.addoption("--cryobox-upload", default=None, help="directory uploaded to /work (default: rootdir)")
    group.addoption("--cryobox-ttl", type=int, default=3600, help="time to live of a kept sandbox")
    group.addoption("--cryobox-setup", default=None, help="command run in /work before the tests")
    parser.addini("cryobox_template", "template of the sandbox (enables the cryobox plugin)", default="")


# no tryfirst marker (it would need pytest at import time): a ``-p`` plugin is registered after pytest's builtin
# plugins, and pluggy calls the latest registered implementation first
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if os.environ.get(INNER_ENV) or config.option.help or config.option.version:
        return None
    template = config.getoption("cryobox_template") or str(config.getini("cryobox_template") or "")
    if not template:
        return None
    upload_opt = config.getoption("cryobox_upload")
    upload = Path(upload_opt).resolve() if upload_opt else config.rootpath
    invocation = config.invocation_params
    args = guest_args(strip_plugin_args(invocation.args), invocation.dir, upload)
    command = "python3 -m pytest " + shlex.join(args) if args else "python3 -m pytest"
    options = CaptureOptions(
        template=template,
        command=command.strip(),
        upload=upload,
        setup=config.getoption("cryobox_setup"),
        timeout_s=float(config.getoption("cryobox_timeout")),
        ttl_s=int(config.getoption("cryobox_ttl")),
    )

    def log(line: str) -> None:
        sys.stderr.write(f"cryobox: {line}\n")
        sys.stderr.flush()

    with sdk_runner(log=log) as runner:
        result = runner.run(options)
    sys.stdout.write(result.setup_output if result.outcome == "setup_failed" else result.log.decode(errors="replace"))
    for note in result.notes:
        sys.stdout.write(f"cryobox: {note}\n")
    snap = result.snapshot_id
    if result.outcome == "failed":
        sys.stdout.write(f"cryobox: captured failing run as snapshot {snap} (restore: cryobox debug {snap})\n")
    elif result.outcome == "hang":
        sys.stdout.write(f"cryobox: captured hung run as snapshot {snap} (restore: cryobox debug {snap})\n")
    elif result.outcome == "setup_failed":
        sys.stdout.write(f"cryobox: setup failed with exit code {result.exit_code}; nothing captured\n")
    sys.stdout.flush()
    return result.exit_status
