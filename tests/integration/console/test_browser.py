"""The web console in a real headless Chromium (Debian's, driven by Playwright) against the shared
``cryobox serve``: log in, create a sandbox, use its terminal, upload and download a file, snapshot and restore,
open a captured failure's evidence, bisect it x16, watch the herd counters move after a burst of creates, log
out. Guest and user strings that look like HTML must render as text. Each page is screenshotted (PNG under
``test-artifacts/console/``) and checked to be non-blank. The tests share one browser and one login and run in
file order."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.console_ui import UI_WAIT_MS, Console, no_dialogs, open_console

HOSTILE_FILE = "<img src=x onerror=alert('file')>"
HOSTILE_META = "<b>bold</b><img src=x onerror=alert('meta')>"
HOSTILE_LOG = "<script>alert('evidence')</script>"
FAILING_TEST = f"""\
print("console-capture: about to fail", flush=True)
print({HOSTILE_LOG!r}, flush=True)
raise SystemExit(3)
"""
BURST = 3
# a small server restoring with lazy memory (its memory server keeps the herd counters); as in test_lazy_memory
LAZY = ["--memory", "lazy", "--no-prefetch", "--templates", "base", "--net-pool", "4"]


@pytest.fixture(scope="module")
def console(server: ServeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with open_console(server, tmp_path_factory) as ui:
        yield ui


def test_login_create_and_terminal(console: Console) -> None:
    page = console.page
    page.goto(f"{console.url}/ui/")
    page.get_by_test_id("page-login").wait_for()
    console.shot("login")
    page.get_by_test_id("login-key").fill("cbx_not_a_key_" + secrets.token_hex(4))
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("login-error")).to_contain_text("not accepted")
    page.get_by_test_id("login-key").fill(console.key)
    page.get_by_test_id("login-submit").click()
    page.get_by_test_id("page-sandboxes").wait_for()
    assert console.key not in page.url
    assert page.evaluate("() => JSON.stringify(localStorage) + document.cookie").find(console.key) == -1
    expect(page.get_by_test_id("workspace")).not_to_be_empty()

    expect(page.get_by_test_id("create-template").locator("option[value=base]")).to_have_count(1)
    page.get_by_test_id("create-template").select_option("base")
    page.get_by_test_id("create-metadata").fill(f"suite=console, note={HOSTILE_META}")
    page.get_by_test_id("create-sandbox").click()
    page.get_by_test_id("page-sandbox").wait_for(timeout=180_000)
    sandbox_id = page.get_by_test_id("page-sandbox").get_attribute("data-id")
    assert sandbox_id
    console.sandboxes.append(sandbox_id)
    console.facts["sandbox"] = sandbox_id
    assert console.http.get(f"/v1/sandboxes/{sandbox_id}").json()["metadata"]["note"] == HOSTILE_META

    # the metadata shows as text, not markup
    expect(page.get_by_test_id("detail-metadata")).to_contain_text(HOSTILE_META)
    assert page.locator("[data-testid=page-sandbox] img").count() == 0

    # the terminal: a command's output (computed by the guest's shell) appears on the xterm screen
    expect(page.get_by_test_id("terminal-status")).to_have_attribute("data-state", "connected", timeout=60_000)
    page.get_by_test_id("terminal").click()
    page.keyboard.type("echo cbx-$((6*7))-ok; uname -s\n")
    rows = page.locator("[data-testid=terminal] .xterm-rows")
    expect(rows).to_contain_text("cbx-42-ok", timeout=30_000)
    expect(rows).to_contain_text("Linux")
    no_dialogs(console)


def test_files_upload_download_and_hostile_names(console: Console, tmp_path: Path) -> None:
    page = console.page
    sandbox_id = console.facts["sandbox"]
    done = console.http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": f"mkdir -p /root && touch /root/{_sh(HOSTILE_FILE)}"}
    )
    assert done.status_code == 200 and done.json()["exit_code"] == 0, done.text
    payload = secrets.token_bytes(200_000) + b"\x00\xff end"
    local = tmp_path / "upload.bin"
    local.write_bytes(payload)

    page.get_by_test_id("files-path").fill("/root")
    page.get_by_test_id("files-go").click()
    hostile = page.locator(f"[data-testid=file-row][data-name={json.dumps(HOSTILE_FILE)}]")
    expect(hostile).to_have_count(1)
    expect(hostile.get_by_test_id("file-name")).to_have_text(HOSTILE_FILE)
    assert page.locator("[data-testid=files-list] img").count() == 0

    page.get_by_test_id("files-upload-input").set_input_files(str(local))
    row = page.locator("[data-testid=file-row][data-name='upload.bin']")
    expect(row).to_have_count(1, timeout=60_000)
    assert console.http.get(f"/v1/sandboxes/{sandbox_id}/fs", params={"path": "/root/upload.bin"}).content == payload

    with page.expect_download() as download_info:
        row.get_by_test_id("file-download").click()
    download = download_info.value
    saved = tmp_path / "downloaded.bin"
    download.save_as(str(saved))
    assert download.suggested_filename == "upload.bin"
    assert saved.read_bytes() == payload

    # the exec box and its history
    page.get_by_test_id("exec-cmd").fill("echo exec-$((2+3)); echo oops >&2")
    page.get_by_test_id("exec-run").click()
    expect(page.get_by_test_id("exec-output")).to_contain_text("exec-5")
    expect(page.get_by_test_id("exec-exit")).to_have_attribute("data-exit", "0")
    history = page.get_by_test_id("exec-history-row").first  # newest first
    expect(history).to_contain_text("echo exec-$((2+3))")
    expect(history).to_contain_text("exec-5")
    console.shot("sandbox-detail")
    no_dialogs(console)


def test_network_policy_form_and_egress_log(console: Console) -> None:
    """The sandbox page shows the policy in force, replaces it from the form (PUT with the session's CSRF
    token), shows a 400's message, and lists egress decisions newest first (a denied DNS query among them)."""
    page = console.page
    sandbox_id = console.facts["sandbox"]
    before = console.http.get(f"/v1/sandboxes/{sandbox_id}/network").json()
    expect(page.get_by_test_id("network-default")).to_have_text(before["default"])
    page.get_by_test_id("network-form-default").select_option("deny")
    page.get_by_test_id("network-form-allow").fill("example.org\n 203.0.113.0/24 \n")
    page.get_by_test_id("network-form-deny").fill("")
    page.get_by_test_id("network-form-ports").fill("443, 80")
    page.get_by_test_id("network-form-save").click()
    expect(page.get_by_test_id("network-form-saved")).to_be_visible()
    assert console.http.get(f"/v1/sandboxes/{sandbox_id}/network").json() == {
        "default": "deny",
        "allow": ["example.org", "203.0.113.0/24"],
        "deny": [],
        "ports": [80, 443],
        "public_traffic": True,
        "mask_request_host": None,
    }
    expect(page.get_by_test_id("network-allow")).to_have_text("example.org 203.0.113.0/24")

    # a policy the server refuses: its message is shown, the policy in force is unchanged
    page.get_by_test_id("network-form-allow").fill("2001:db8::/32")
    page.get_by_test_id("network-form-save").click()
    expect(page.get_by_test_id("network-form-error")).to_contain_text("allow: '2001:db8::/32': IPv6 egress is not")
    expect(page.get_by_test_id("network-form-error")).to_contain_text("HTTP 400")
    assert console.http.get(f"/v1/sandboxes/{sandbox_id}/network").json()["allow"] == ["example.org", "203.0.113.0/24"]

    # a name the policy does not allow (and no allowed network it could be in): the guest's query is denied, logged
    narrowed = console.http.put(f"/v1/sandboxes/{sandbox_id}/network", json={"allow": ["example.org"]})
    assert narrowed.status_code == 200, narrowed.text
    done = console.http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "getent hosts blocked.example.net || true"}
    )
    assert done.status_code == 200, done.text
    page.get_by_test_id("egress-refresh").click()
    denied = page.locator("[data-testid=egress-row][data-allowed=false]", has_text="blocked.example.net")
    expect(denied.first).to_be_visible(timeout=30_000)
    expect(denied.first).to_contain_text("denied")
    times = page.locator("[data-testid=egress-row] td:first-child").all_inner_texts()
    assert times == sorted(times, reverse=True), times  # newest first
    console.shot("sandbox-network")
    no_dialogs(console)
    restored = console.http.put(f"/v1/sandboxes/{sandbox_id}/network", json=before)  # for the tests after this one
    assert restored.status_code == 200, restored.text


def test_usage_chart_and_log(console: Console) -> None:
    """The sandbox page charts its CPU and memory from the agent's samples (the suite's server samples every second)
    and lists its log newest first: a line its guest wrote to the serial console (shown as text) and the agent's."""
    page = console.page
    sandbox_id = console.facts["sandbox"]
    done = console.http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": f"echo {_sh(HOSTILE_LOG)} > /dev/console"}
    )
    assert done.status_code == 200 and done.json()["exit_code"] == 0, done.text
    console.go(f"sandboxes/{sandbox_id}", "page-sandbox")
    cpu = page.get_by_test_id("usage-cpu")
    expect(cpu).to_have_count(1, timeout=30_000)  # two samples make a line
    assert len((cpu.get_attribute("points") or "").split()) >= 2
    expect(page.get_by_test_id("usage-mem")).to_have_count(1)
    expect(page.get_by_test_id("usage-latest")).to_contain_text("CPU")
    rows = page.locator("[data-testid=sandbox-log-row][data-source=console]", has_text=HOSTILE_LOG)
    deadline = time.monotonic() + 30
    while rows.count() == 0 and time.monotonic() < deadline:
        page.get_by_test_id("sandbox-log-refresh").click()
        page.wait_for_timeout(500)
    expect(rows.first).to_be_visible()
    started = page.locator("[data-testid=sandbox-log-row][data-source=agent]", has_text="started: restored from")
    expect(started.first).to_be_visible()
    console.shot("sandbox-usage")
    no_dialogs(console)


def test_snapshot_and_restore(console: Console) -> None:
    page = console.page
    page.get_by_test_id("action-snapshot").click()
    page.get_by_test_id("confirm-dialog").wait_for()
    console.confirm()
    snap_link = page.get_by_test_id("snapshot-id").locator("a")
    expect(snap_link).to_have_count(1, timeout=180_000)
    snapshot_id = snap_link.inner_text()
    console.snapshots.append(snapshot_id)
    assert console.http.get(f"/v1/snapshots/{snapshot_id}").json()["sandbox_id"] == console.facts["sandbox"]

    snap_link.click()
    page.get_by_test_id("page-snapshot").wait_for()
    expect(page.get_by_test_id("snapshot-facts")).to_contain_text(snapshot_id)
    expect(page.get_by_test_id("fork-tree").locator(f"[data-id='{snapshot_id}']")).to_have_count(1)
    page.get_by_test_id("snapshot-restore").click()
    console.confirm()
    restored = page.get_by_test_id("restored-id").locator("a")
    expect(restored).to_have_count(1, timeout=180_000)
    restored_id = restored.inner_text()
    console.sandboxes.append(restored_id)
    body = console.http.get(f"/v1/sandboxes/{restored_id}").json()
    assert body["from_snapshot"] == snapshot_id and body["status"] == "running"
    # the restored machine has the file uploaded before the snapshot
    listing = console.http.get(f"/v1/sandboxes/{restored_id}/fs/dir", params={"path": "/root"}).json()
    assert "upload.bin" in {e["name"] for e in listing["entries"]}
    console.http.delete(f"/v1/sandboxes/{restored_id}")
    no_dialogs(console)


def test_captured_failure_evidence_and_bisect(console: Console, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "test_fails.py").write_text(FAILING_TEST)
    env = {**os.environ, "CRYOBOX_API_URL": console.url, "CRYOBOX_API_KEY": console.key, "COLUMNS": "200"}
    env.pop("CRYOBOX_CAPTURE_INNER", None)
    argv = [sys.executable, "-m", "cryobox.cli.main", "capture", "--template", "base", "--upload", str(project)]
    argv += ["--json", "--seed", "7", "--timeout", "120", "--", "python3", "test_fails.py"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    result = json.loads(done.stdout)
    if result.get("sandbox_id"):
        console.sandboxes.append(result["sandbox_id"])
    if result.get("snapshot_id"):
        console.snapshots.append(result["snapshot_id"])
    assert done.returncode != 0 and result["outcome"] == "failed" and result["exit_code"] == 3, done.stderr
    snapshot_id = result["snapshot_id"]
    # the kept machine is not needed for the bisect (that restores the snapshot)
    console.http.delete(f"/v1/sandboxes/{result['sandbox_id']}", params={"keep_snapshots": "true"})

    page = console.page
    console.go("snapshots", "page-snapshots")
    row = page.locator(f"[data-testid=snapshot-row][data-id='{snapshot_id}']")
    expect(row).to_have_count(1, timeout=30_000)
    expect(row.get_by_test_id("snapshot-labels")).to_contain_text("cryobox.capture=failure")
    expect(row.get_by_test_id("snapshot-retain")).to_be_checked()
    console.shot("snapshots")

    row.locator("a").first.click()
    page.get_by_test_id("page-snapshot").wait_for()
    expect(page.locator("[data-testid=provenance-row][data-key=command]")).to_contain_text("python3 test_fails.py")
    expect(page.locator("[data-testid=provenance-row][data-key=exit_code]")).to_contain_text("3")
    expect(page.locator("[data-testid=provenance-row][data-key=seed]")).to_contain_text("7")
    page.locator("[data-testid=evidence-file][data-name='test.log']").click()
    viewer = page.get_by_test_id("evidence-viewer")
    expect(viewer).to_contain_text("console-capture: about to fail")
    expect(viewer).to_contain_text(HOSTILE_LOG)  # shown as text
    sizes = {f["name"]: f["size"] for f in console.http.get(f"/v1/snapshots/{snapshot_id}/evidence").json()["files"]}
    for name in ("console.log", "qemu.log"):  # streamed to the end (they may be short or empty)
        page.locator(f"[data-testid=evidence-file][data-name='{name}']").click()
        expect(page.get_by_test_id("evidence-name")).to_have_text(name)
        expect(page.get_by_test_id("evidence-status")).to_have_attribute("data-done", "1")
        expect(page.get_by_test_id("evidence-status")).to_have_attribute("data-bytes", str(sizes[name]))

    expect(page.get_by_test_id("bisect-command")).to_have_value("cd /work && python3 test_fails.py")
    started = time.monotonic()
    page.get_by_test_id("bisect-start").click()
    console.confirm()
    ratio = page.get_by_test_id("bisect-ratio")
    expect(ratio).to_have_count(1, timeout=420_000)
    print(f"bisect x16 took {time.monotonic() - started:.1f} s: {ratio.inner_text()}")
    match = re.fullmatch(r"(\d+)/16", ratio.inner_text())
    assert match, ratio.inner_text()
    assert int(match.group(1)) == 16, "the test always fails: every child must reproduce"
    page.locator("[data-testid=evidence-file][data-name='test.log']").click()
    expect(viewer).to_contain_text("console-capture: about to fail")
    console.shot("snapshot-detail")
    no_dialogs(console)


def _herd(page: Page) -> tuple[int, int]:
    """(creates, sum of the herd counters) as the fleet page shows them now."""
    creates = int(page.get_by_test_id("creates-total").inner_text())
    herd = sum(
        int(page.get_by_test_id(f"herd-total-{key}").inner_text())
        for key in ("faults", "chunk_fetches", "cache_hits", "store_gets")
    )
    return creates, herd


def test_fleet_page(console: Console) -> None:
    page = console.page
    console.go("fleet", "page-fleet")
    expect(page.get_by_test_id("agent-row").first).to_have_attribute("data-status", "up")
    expect(page.get_by_test_id("fleet-accelerator")).to_have_text(re.compile(r"^(kvm|tcg)$"))
    # earlier tests created sandboxes: the samples count them
    expect(page.get_by_test_id("creates-total")).to_have_text(re.compile(r"^[1-9]\d*$"), timeout=30_000)
    expect(page.get_by_test_id("chart-faults")).to_be_visible()
    expect(page.get_by_test_id("chart-create-latency")).to_be_visible()
    no_dialogs(console)


def test_templates_page(console: Console) -> None:
    page = console.page
    console.go("templates", "page-templates")
    for name in ("base", "code-interpreter"):
        row = page.locator(f"[data-testid=template-row][data-name='{name}']")
        expect(row).to_have_attribute("data-status", "ready")
    page.get_by_test_id("template-name").fill("Not A Valid Name")
    page.get_by_test_id("template-create").click()
    expect(page.get_by_test_id("template-create-error")).not_to_be_empty()
    assert console.http.get("/v1/templates/Not A Valid Name").status_code == 404
    console.shot("templates")

    console.go("sandboxes", "page-sandboxes")
    row = page.locator(f"[data-testid=sandbox-row][data-id='{console.facts['sandbox']}']")
    expect(row.get_by_test_id("sandbox-metadata")).to_contain_text(HOSTILE_META)
    assert page.locator("[data-testid=sandbox-list] img").count() == 0
    page.get_by_test_id("sandbox-filter").fill("suite=console")
    expect(page.get_by_test_id("sandbox-row")).to_have_count(1)
    page.get_by_test_id("sandbox-filter").fill("suite=nothing-has-this")
    expect(page.get_by_test_id("sandbox-empty")).to_be_visible()
    page.get_by_test_id("sandbox-filter").fill("")
    console.shot("sandboxes")
    no_dialogs(console)


def test_a_dockerfile_build_from_the_templates_page_streams_its_log(console: Console) -> None:
    """The Dockerfile editor posts a real build (a build VM runs its RUN); the log view shows the step's output
    live, then the build's end, and the new template is listed ready."""
    page = console.page
    name = f"ui-df-{secrets.token_hex(3)}"
    marker = f"hello-from-the-ui-{secrets.token_hex(3)}"
    console.go("templates", "page-templates")
    page.get_by_test_id("dockerfile-name").fill(name)
    page.get_by_test_id("dockerfile-text").fill(f"FROM debian:bookworm\nRUN echo {marker} > /built\nRUN cat /built\n")
    page.get_by_test_id("dockerfile-build").click()
    try:
        expect(page.get_by_test_id("build-log")).to_contain_text(marker, timeout=600_000)
        expect(page.get_by_test_id("build-log-status")).to_contain_text("done", timeout=600_000)
        row = page.locator(f"[data-testid=template-row][data-name='{name}']")
        expect(row).to_have_attribute("data-status", "ready", timeout=UI_WAIT_MS)
        console.shot("template-build")
    finally:
        console.http.delete(f"/v1/templates/{name}")


def test_logout_ends_the_session(console: Console) -> None:
    page = console.page
    cookies = {c["name"]: c["value"] for c in page.context.cookies() if c["name"] == "cryobox_session"}
    assert cookies, "no session cookie"
    assert page.evaluate("async () => (await fetch('/v1/sandboxes')).status") == 200
    page.get_by_test_id("logout").click()
    page.get_by_test_id("page-login").wait_for()
    assert page.evaluate("async () => (await fetch('/v1/sandboxes')).status") == 401
    # the old cookie, replayed, is dead server-side too
    assert httpx.get(f"{console.url}/v1/sandboxes", cookies=cookies, timeout=30).status_code == 401
    page.goto(f"{console.url}/ui/#/sandboxes")
    page.get_by_test_id("page-login").wait_for()
    assert page.get_by_test_id("sandbox-list").count() == 0
    no_dialogs(console)


def test_herd_counters_move_after_a_burst(
    console: Console, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> None:
    """The herd counters are the memory server's: only a server restoring with lazy memory has them moving, so
    this test runs its own small one (last: a second login replaces the shared server's cookie on 127.0.0.1)."""
    data_dir = tmp_path_factory.mktemp("console-lazy")
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=LAZY) as serve:
        http = httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {serve.api_key}"}, timeout=300)
        made: list[str] = []
        try:
            _burst_and_watch(console, serve, http, made)
        finally:
            for sandbox_id in made:
                http.delete(f"/v1/sandboxes/{sandbox_id}")
            http.close()
    assert find_own_qemus(data_dir / "vol" / "run") == []


def _burst_and_watch(console: Console, serve: ServeProcess, http: httpx.Client, made: list[str]) -> None:
    page = console.page
    console.browser.forward(int(serve.url.rsplit(":", 1)[1]))
    page.goto(f"{serve.url}/ui/#/login")
    page.get_by_test_id("login-key").fill(serve.api_key)
    page.get_by_test_id("login-submit").click()
    page.get_by_test_id("page-sandboxes").wait_for()
    page.goto(f"{serve.url}/ui/#/fleet")
    page.get_by_test_id("page-fleet").wait_for()
    expect(page.get_by_test_id("creates-total")).to_have_text(re.compile(r"^\d+$"), timeout=30_000)
    creates_before, herd_before = _herd(page)

    def create(_: int) -> str:
        response = http.post("/v1/sandboxes", json={"template": "base", "ttl_seconds": 300})
        assert response.status_code == 201, response.text
        sandbox_id: str = response.json()["id"]
        made.append(sandbox_id)
        return sandbox_id

    with ThreadPoolExecutor(BURST) as pool:
        list(pool.map(create, range(BURST)))
    deadline = time.monotonic() + 30
    creates, herd = creates_before, herd_before
    while time.monotonic() < deadline:
        creates, herd = _herd(page)
        if creates >= creates_before + BURST and herd > herd_before:
            break
        page.wait_for_timeout(500)
    assert creates >= creates_before + BURST, (creates_before, creates)
    assert herd > herd_before, f"the herd counters did not move: {herd_before} -> {herd}"
    page.wait_for_timeout(2500)  # one more sample, so the rate charts show the step
    console.shot("fleet")
    page.get_by_test_id("logout").click()
    page.get_by_test_id("page-login").wait_for()
    no_dialogs(console)


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
