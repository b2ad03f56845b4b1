"""The console's browser tests' shared pieces: a logged-out Chromium page on the shared server
(:func:`open_console`), what a flow made (deleted at the end), a login, and the check that no hostile string ran."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from cryobox.bench.server import ServeProcess
from tests.support.browser import Chromium, check_screenshot
from tests.support.paths import REPO

ARTIFACTS = REPO / "test-artifacts" / "console"
UI_WAIT_MS = 60_000


@dataclass
class Console:
    """The browser page plus what the flow made (deleted at the end) and learnt."""

    page: Page
    browser: Chromium
    url: str
    key: str
    http: httpx.Client
    sandboxes: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def go(self, route: str, testid: str) -> None:
        self.page.goto(f"{self.url}/ui/#/{route}")
        self.page.get_by_test_id(testid).wait_for(timeout=UI_WAIT_MS)

    def shot(self, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        colours = check_screenshot(path)
        print(f"screenshot {path} ({colours} colours)")
        return path

    def confirm(self) -> None:
        self.page.get_by_test_id("confirm-ok").click()

    def login(self) -> None:
        self.page.goto(f"{self.url}/ui/#/login")
        self.page.get_by_test_id("login-key").fill(self.key)
        self.page.get_by_test_id("login-submit").click()
        self.page.get_by_test_id("page-sandboxes").wait_for()

    def cleanup(self) -> None:
        for sandbox_id in self.sandboxes:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        for snapshot_id in self.snapshots:
            self.http.delete(f"/v1/snapshots/{snapshot_id}")
        for name in self.volumes:  # after the sandboxes that held them
            self.http.delete(f"/v1/volumes/{name}")


@contextlib.contextmanager
def open_console(server: ServeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """One browser for a test module, not logged in; what the flow recorded is deleted at the end."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # a namespace of its own: Chromium aborts requests whenever an interface of its namespace changes
    browser = Chromium(tmp_path_factory.mktemp("chromium-profile"), ports=[int(server.url.rsplit(":", 1)[1])])
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.api_key}"}, timeout=300)
    try:
        page = browser.start()
        page.set_default_timeout(UI_WAIT_MS)
        ui = Console(page=page, browser=browser, url=server.url, key=server.api_key, http=http)
        try:
            yield ui
        finally:
            ui.cleanup()
    finally:
        try:
            browser.close()
        finally:
            http.close()


def no_dialogs(ui: Console) -> None:
    assert not ui.browser.dialogs, f"a hostile string ran as HTML: {ui.browser.dialogs}"
    assert not ui.browser.page_errors, ui.browser.page_errors
