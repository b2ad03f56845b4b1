"""Debian's Chromium driven by Playwright for the console's browser tests: launched with a fresh profile and
flags that keep it off every network but loopback, and gone (checked) after :meth:`Chromium.close`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from PIL import Image
from playwright.sync_api import BrowserContext, Dialog, Page, Playwright, sync_playwright

from tests.support.loopfwd import LoopbackNamespace
from tests.support.teardown import processes_naming

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--no-default-browser-check",
]
VIEWPORT = {"width": 1280, "height": 800}
MIN_COLOURS = 24
MAX_DOMINANT_SHARE = 0.98


class Chromium:
    """One browser (one profile, one context) for a whole test module."""

    def __init__(self, profile: Path, ports: list[int] | None = None) -> None:
        """``ports``: run the browser in a network namespace of its own where ``127.0.0.1:<port>`` reaches the
        host's (:class:`~tests.support.loopfwd.LoopbackNamespace`): no other test's network slots disturb it."""
        self.profile = profile
        self.ports = ports
        self.netns: LoopbackNamespace | None = None
        self.playwright: Playwright | None = None
        self.context: BrowserContext | None = None
        self.dialogs: list[str] = []
        self.page_errors: list[str] = []

    def start(self) -> Page:
        assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium (make setup does)"
        self.profile.mkdir(parents=True, exist_ok=True)
        executable = CHROMIUM
        if self.ports is not None:
            self.netns = LoopbackNamespace(self.ports)
            executable = self.netns.wrapper(CHROMIUM, self.profile.parent)
        self.playwright = sync_playwright().start()
        self.context = self.playwright.chromium.launch_persistent_context(
            str(self.profile),
            executable_path=str(executable),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]},
            accept_downloads=True,
        )
        page = self.context.pages[0] if self.context.pages else self.context.new_page()
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        return page

    def forward(self, port: int) -> None:
        """Let the browser reach the host's ``127.0.0.1:port`` too (a server started after it)."""
        if self.netns is not None:
            self.netns.add(port)

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        with contextlib.suppress(Exception):
            dialog.dismiss()

    def close(self) -> None:
        try:
            if self.context is not None:
                with contextlib.suppress(Exception):
                    self.context.close()
            if self.playwright is not None:
                with contextlib.suppress(Exception):
                    self.playwright.stop()
        finally:
            left = self._reap()
            shutil.rmtree(self.profile, ignore_errors=True)
            if self.netns is not None:
                self.netns.close()
        assert not left, f"Chromium processes outlived the browser: {left}"

    def _reap(self) -> list[int]:
        """Processes still naming the profile dir after close (waited for, then killed): the leftovers."""
        deadline = time.monotonic() + 10
        while (pids := processes_naming(self.profile)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


def check_screenshot(path: Path) -> int:
    """Decode the PNG and insist it shows something: many colours, none covering nearly everything.
    Returns the number of distinct colours."""
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        width, height = rgb.size
        colours = rgb.getcolors(maxcolors=width * height) or []
    assert len(colours) >= MIN_COLOURS, f"{path}: only {len(colours)} colours (blank page?)"
    share = max(count for count, _ in colours) / (width * height)
    assert share < MAX_DOMINANT_SHARE, f"{path}: one colour covers {share:.1%}"
    return len(colours)
