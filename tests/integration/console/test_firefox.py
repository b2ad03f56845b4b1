"""The console's login page renders in Debian's Firefox ESR (headless screenshot, checked non-blank). Only that:
Firefox has no WebDriver here (Debian ships no geckodriver, and Playwright's Firefox is its own patched build),
so the full flow runs in Chromium only (test_browser.py). Firefox runs in its own network namespace with only
loopback (tests/support/firefox_shot.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cryobox.console.static import STATIC_DIR
from tests.support.browser import check_screenshot
from tests.support.paths import REPO
from tests.support.teardown import processes_naming

ARTIFACTS = REPO / "test-artifacts" / "console"


@pytest.mark.timeout(180)
def test_login_page_renders_in_firefox(tmp_path: Path) -> None:
    assert shutil.which("firefox-esr"), "firefox-esr is missing: apt-get install firefox-esr (make setup does)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / "login-firefox.png"
    out.unlink(missing_ok=True)
    profile = tmp_path / "firefox-profile"
    root = REPO
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]), "MOZ_HEADLESS": "1"}
    argv = ["unshare", "--net", "--", sys.executable, "-m", "tests.support.firefox_shot"]
    try:
        done = subprocess.run(
            [*argv, str(STATIC_DIR), str(profile), str(out)],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=150,
            check=False,
        )
    finally:
        left = processes_naming(profile)
        for pid in left:
            os.kill(pid, 9)
    assert not left, f"Firefox processes outlived the screenshot: {left}"
    assert done.returncode == 0 and out.exists(), done.stderr
    print(f"screenshot {out} ({check_screenshot(out)} colours)")
