"""The driver runs where it is shipped: as ``cryobox_guest.build`` with nothing but the standard library."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import cryobox.guest.build as build

PACKAGE = Path(build.__file__).resolve().parent


def test_only_the_standard_library_and_relative_imports() -> None:
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names | {"__future__"}, f"{path.name}: {name}"


def test_it_runs_as_cryobox_guest_build(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE.parent, tmp_path / "cryobox_guest", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-E", "-s", "-m", "cryobox_guest.build", "nonsense"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 64
    assert done.stderr.startswith("cryobox-build: error: usage: python3 -m cryobox_guest.build {prepare|unpack|")
