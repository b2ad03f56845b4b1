"""E2B's JavaScript SDKs (npm ``e2b`` and ``@e2b/code-interpreter``, pinned in ``tests/js/package.json``, installed by
``make setup``) run unchanged against a control plane: a node program under ``tests/js/`` sees only the environment a
user of a self-hosted E2B sets (:func:`tests.support.e2b.e2b_env`) and prints one JSON report (``report.mjs``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.e2b import e2b_env
from tests.support.node import BIN, E2B_JS, NODE


def node_app_env(url: str, api_key: str, home: Path, **extra: str) -> dict[str, str]:
    """E2B's variables and nothing of this process but ``PATH`` (the pinned node first), ``LANG`` and ``TMPDIR``."""
    env = e2b_env(url, api_key, home)
    return {**env, "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}", **extra}


def run_node_app(app: str, env: dict[str, str], timeout_s: float = 600) -> dict[str, Any]:
    """Run ``tests/js/<app>`` with ``env``: its report, checked to hold no step that threw (each step's value or
    ``{"error": ...}`` under its name; ``fatal`` when the program itself failed)."""
    assert (E2B_JS / "node_modules" / "e2b").is_dir(), "tests/js has no node_modules: run `make setup`"
    done = subprocess.run(
        [str(NODE), str(E2B_JS / app)], env=env, cwd=E2B_JS, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.stdout.strip(), f"{app} printed no report (rc {done.returncode}): {done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fatal" not in report, report["fatal"]
    errors = {k: v for k, v in report.items() if k != "_ms" and isinstance(v, dict) and "error" in v}
    assert not errors, "\n".join(f"{k}: {v['error']}\n{v.get('trace', '')}" for k, v in errors.items())
    assert done.returncode == 0, f"{app} exited {done.returncode}: {done.stderr[-4000:]}"
    return report
