"""The console's volumes page (``#/volumes``) in a real headless Chromium against the shared ``cryobox serve``: a
volume created through the page is listed with its size and grown; a shrink, a delete and a grow of a volume a
real sandbox has mounted are refused with the API's own messages (400, 409); the sandbox page lists its mount; a
free volume is deleted and gone. A name and a mount path holding HTML render as text (no element injected)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator

import pytest
from playwright.sync_api import Locator, Page, expect

from cryobox.bench.server import ServeProcess
from tests.support.console_ui import Console, no_dialogs, open_console

HOSTILE_NAME = "<img src=x onerror=alert('volume')>"
HOSTILE_PATH = "/mnt/<b>held</b><img src=x onerror=alert('path')>"
"""A valid mount path (absolute, normalized, outside the guest's own trees): users choose these too."""
INJECTED = "img, b, script"


@pytest.fixture(scope="module")
def console(server: ServeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with open_console(server, tmp_path_factory) as ui:
        ui.login()
        yield ui


def _row(page: Page, name: str) -> Locator:
    return page.locator(f"[data-testid=volume-row][data-name={json.dumps(name)}]")


def _create(page: Page, name: str, amount: int, unit: str) -> None:
    page.get_by_test_id("volume-name").fill(name)
    page.get_by_test_id("volume-size").fill(str(amount))
    page.get_by_test_id("volume-unit").select_option(unit)
    page.get_by_test_id("volume-create").click()


def _grow(ui: Console, name: str, size_mb: int) -> None:
    _row(ui.page, name).get_by_test_id("volume-grow").click()
    ui.page.get_by_test_id("confirm-input").fill(str(size_mb))
    ui.confirm()


def _delete(ui: Console, name: str) -> None:
    _row(ui.page, name).get_by_test_id("volume-delete").click()
    ui.confirm()


def test_volumes_page_create_grow_refusals_and_delete(console: Console) -> None:
    page, http = console.page, console.http
    page.get_by_test_id("nav-volumes").click()
    page.get_by_test_id("page-volumes").wait_for()
    free, held = f"ui-free-{secrets.token_hex(3)}", f"ui-held-{secrets.token_hex(3)}"
    console.volumes += [free, held]
    error = page.get_by_test_id("volume-error")

    # a name holding HTML: the API refuses it (400); its message is shown with the name as text; nothing is made
    _create(page, HOSTILE_NAME, 64, "MiB")
    expect(error).to_contain_text(f'create "{HOSTILE_NAME}": invalid request: body.name')
    expect(error).to_contain_text("HTTP 400")
    assert page.locator("[data-testid=page-volumes]").locator(INJECTED).count() == 0
    assert HOSTILE_NAME not in {v["name"] for v in http.get("/v1/volumes").json()["items"]}

    # made through the page: listed with its size and what its file system uses
    _create(page, free, 64, "MiB")
    row = _row(page, free)
    expect(row.get_by_test_id("volume-size-cell")).to_have_text("64.0 MiB")
    expect(row.get_by_test_id("volume-used")).to_have_text(re.compile(r"^\d+(\.\d)? (B|KiB|MiB)$"))
    expect(row.get_by_test_id("volume-status")).to_have_text("ready")
    expect(error).to_be_empty()
    assert http.get(f"/v1/volumes/{free}").json()["size_mb"] == 64

    # grown; a shrink is the API's 400, shown, and changes nothing
    _grow(console, free, 128)
    expect(row.get_by_test_id("volume-size-cell")).to_have_text("128.0 MiB")
    assert http.get(f"/v1/volumes/{free}").json()["size_mb"] == 128
    _grow(console, free, 32)
    expect(error).to_contain_text(f'grow "{free}": a volume only grows')
    expect(error).to_contain_text("HTTP 400")
    expect(row.get_by_test_id("volume-size-cell")).to_have_text("128.0 MiB")
    assert http.get(f"/v1/volumes/{free}").json()["size_mb"] == 128

    # one a real sandbox mounts (created through the API at a path holding HTML)
    _create(page, held, 1, "GiB")
    expect(_row(page, held).get_by_test_id("volume-size-cell")).to_have_text("1.0 GiB")
    made = http.post("/v1/sandboxes", json={"template": "base", "volumes": [{"name": held, "path": HOSTILE_PATH}]})
    assert made.status_code == 201, made.text
    sandbox_id = made.json()["id"]
    console.sandboxes.append(sandbox_id)
    quoted = "'" + HOSTILE_PATH.replace("'", "'\"'\"'") + "'"
    mounted = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": f"findmnt -n -o FSTYPE --mountpoint {quoted}"})
    assert mounted.status_code == 200 and mounted.json()["stdout"].strip() == "ext4", mounted.text

    page.get_by_test_id("volume-refresh").click()
    attachment = _row(page, held).get_by_test_id("volume-attachment")
    expect(attachment).to_have_count(1)
    expect(attachment).to_have_attribute("data-mode", "rw")
    expect(attachment).to_contain_text("(read-write)")
    expect(attachment.get_by_test_id("volume-attachment-path")).to_have_text(HOSTILE_PATH)
    expect(attachment.locator("a")).to_have_attribute("href", f"#/sandboxes/{sandbox_id}")
    assert page.locator("[data-testid=page-volumes]").locator(INJECTED).count() == 0

    # attached: a delete and a grow are the API's 409s, shown; the volume stays as it was
    _delete(console, held)
    expect(error).to_contain_text(f'delete "{held}": volume vol-')
    expect(error).to_contain_text(f"is attached to {sandbox_id}")
    expect(error).to_contain_text("HTTP 409")
    _grow(console, held, 2048)
    expect(error).to_contain_text(f"grow \"{held}\": volume '{held}' is attached")
    expect(error).to_contain_text("HTTP 409")
    after = http.get(f"/v1/volumes/{held}")
    assert after.status_code == 200 and after.json()["size_mb"] == 1024, after.text
    expect(_row(page, held)).to_have_count(1)
    console.shot("volumes")

    # the sandbox's page lists its mount (the path as text)
    attachment.locator("a").click()
    page.get_by_test_id("page-sandbox").wait_for()
    mount = page.locator(f"[data-testid=sandbox-volume-row][data-name='{held}']")
    expect(mount).to_have_attribute("data-mode", "rw")
    expect(mount.get_by_test_id("sandbox-volume-path")).to_have_text(HOSTILE_PATH)
    expect(page.get_by_test_id("sandbox-volume-row")).to_have_count(1)
    assert page.get_by_test_id("volumes-card").locator(INJECTED).count() == 0
    console.shot("sandbox-volumes")

    # a free volume is deleted and gone; the held one, once its sandbox is killed, too
    console.go("volumes", "page-volumes")
    _delete(console, free)
    expect(_row(page, free)).to_have_count(0)
    expect(error).to_be_empty()
    assert http.get(f"/v1/volumes/{free}").status_code == 404
    assert http.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
    page.get_by_test_id("volume-refresh").click()
    expect(_row(page, held).get_by_test_id("volume-free")).to_have_count(1)
    _delete(console, held)
    expect(_row(page, held)).to_have_count(0)
    assert http.get(f"/v1/volumes/{held}").status_code == 404
    no_dialogs(console)
