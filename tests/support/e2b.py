"""The E2B SDK application (tests/integration/apps/e2b_app.py) run unchanged against a control plane: it sees only
the environment a user of a self-hosted E2B sets; for the E2B and the fleet integration tests."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import APPS, REPO

E2B_VERSION = "2.63.0"
E2B_CODE_INTERPRETER_VERSION = "2.11.5"
"""The ``e2b`` and ``e2b-code-interpreter`` SDKs the compatibility tests run unchanged (their own virtualenv:
their dependencies are not ours)."""


def sdk_python(cache_dir: Path) -> Path:
    """The python of a virtualenv holding the pinned SDKs, made from PyPI the first time (under a lock: the
    suite's workers share it) and reused while the pins hold. Never a reason to skip a test."""
    venv = cache_dir / "venvs" / f"e2b-{E2B_VERSION}-ci-{E2B_CODE_INTERPRETER_VERSION}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".e2b-{E2B_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = venv / ".installed"
        if not marker.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            pins = [f"e2b=={E2B_VERSION}", f"e2b-code-interpreter=={E2B_CODE_INTERPRETER_VERSION}"]
            subprocess.run([*pip, *pins], check=True, timeout=600)
            marker.touch()
    return venv / "bin" / "python"


APP = APPS / "e2b_app.py"


def e2b_env(url: str, api_key: str, home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    return {
        **keep,
        "HOME": str(home),
        "E2B_API_URL": f"{url}/e2b",
        "E2B_SANDBOX_URL": f"{url}/e2b/sandbox",
        "E2B_VOLUME_API_URL": f"{url}/e2b",
        "E2B_API_KEY": api_key,
    }


def run_app(python: Path, url: str, api_key: str, home: Path, *args: str, app: Path = APP) -> dict[str, Any]:
    """Run the E2B application ``app`` against the control plane at ``url``; its report, every step checked to have
    run without an exception (``after_kill`` raises on purpose)."""
    env = e2b_env(url, api_key, home)
    done = subprocess.run([str(python), str(app), *args], env=env, capture_output=True, text=True, timeout=900)
    return _checked_report(done, allowed=("after_kill",))


def run_app_module(python: Path, url: str, api_key: str, home: Path, module: str) -> dict[str, Any]:
    """Run an E2B application that shares ``e2b_app``'s steps (``python -m tests.integration.apps.<module>``, from
    the repository's root) like :func:`run_app`; its report, every step checked to have run without an exception."""
    env = {**e2b_env(url, api_key, home), "PYTHONPATH": str(REPO)}
    argv = [str(python), "-m", f"tests.integration.apps.{module}"]
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    return _checked_report(done)


def _checked_report(done: subprocess.CompletedProcess[str], allowed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The app's report (its last stdout line), no step but ``allowed`` ones having raised."""
    assert done.stdout.strip(), f"the app printed no report (rc {done.returncode}): {done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    errors = {k: v["error"] for k, v in report.items() if isinstance(v, dict) and "error" in v and k not in allowed}
    assert not errors, json.dumps({k: report[k] for k in errors}, indent=1)
    return report


URLS_APP = APPS / "e2b_urls_app.py"


def assert_urls_report(report: dict[str, Any]) -> None:
    """What ``e2b_urls_app.py`` must report, on a fake agent and on a VM alike."""
    assert "fatal" not in report, report["fatal"]
    assert report["upload_url"].split("?")[0].endswith("/files") and "signature=v1_" in report["upload_url"]
    assert report["upload"] == {
        "status": 200,
        "body": [{"name": "up.txt", "type": "file", "path": "/home/user/signed/up.txt"}],
    }
    assert report["download"] == {"status": 200, "body": "signed upload\n"}
    assert report["upload_raw"]["status"] == 200 and report["read_raw"] == "raw bytes"
    assert report["download_relative"] == report["download_under_sandbox_url"] == report["download"]
    invalid = ("tampered_path", "tampered_user", "tampered_signature", "tampered_expiration", "expiration_removed")
    for name in (*invalid, "upload_url_for_download", "download_url_for_upload"):
        assert report[name] == {"status": 401, "body": {"code": 401, "message": "invalid signature"}}, name
    for name in ("expired_download", "expired_upload"):
        assert report[name] == {"status": 401, "body": {"code": 401, "message": "signature is already expired"}}
    for name in ("no_signature", "wrong_token_header"):
        assert report[name]["status"] == 401 and report[name]["body"]["code"] == 401, name
    assert (
        report["bad_expiration"]["status"] == 400
        and "signature_expiration" in report["bad_expiration"]["body"]["message"]
    )
    assert report["after_refusals"] == "signed upload\n"  # the refused upload wrote nothing
    assert report["late_written"] == "FileNotFoundException"  # nor did the expired one
