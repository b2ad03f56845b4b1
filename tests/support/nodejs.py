"""The console's ES modules run under Node (Debian's nodejs, from ``make setup``: a missing one fails the tests
that use it, never skips them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cryobox.console import static as console_static

JS = console_static.STATIC_DIR / "js"
NODE = shutil.which("node")


def run_module(tmp_path: Path, script: str) -> Any:
    """Run ``script`` (an ES module, next to a copy of ``js/``) under Node; its last stdout line is JSON."""
    root = tmp_path / "console"
    shutil.copytree(JS, root / "js")
    (root / "package.json").write_text('{"type": "module"}')
    (root / "js" / "probe.js").write_text(script)
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(root / "js" / "probe.js")], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
