"""The console's network panel (``js/network.js`` on the sandbox page): the PUT body the form builds (the whole
policy, one rule per line), the log shown newest first, and ``js/api.js`` sending a PUT with the session's CSRF
token and turning a 400 into the error the panel shows. The page's modules run under Node (no DOM is touched by
what is tested here); the panel in a real browser is ``tests/integration/console/test_browser.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cryobox.console import static as console_static
from tests.support.nodejs import run_module

JS = console_static.STATIC_DIR / "js"
NODE = shutil.which("node")  # Debian's nodejs, from make setup: a missing one fails these tests, never skips them


def test_the_form_builds_the_whole_policy(tmp_path: Path) -> None:
    out = run_module(
        tmp_path,
        """
import { policyFromForm, parsePorts, newestFirst } from "./network.js";
const body = policyFromForm({
  defaultAction: "allow",
  allow: "  10.0.0.0/8 \\n\\nexample.org\\n*.example.org\\n",
  deny: "evil.example.org",
  ports: "443, 80 8080",
  publicTraffic: false,
  maskHost: "  ",
});
const empty = policyFromForm({
  defaultAction: "nonsense", allow: "", deny: "", ports: "", publicTraffic: true, maskHost: "localhost:${PORT}",
});
const errors = [];
for (const bad of ["0", "65536", "44x", "-1"]) {
  try { parsePorts(bad); errors.push(null); } catch (err) { errors.push(err.message); }
}
const order = newestFirst([{ time: 1, name: "a" }, { time: 2, name: "b" }, { time: 2, name: "c" }]).map((d) => d.name);
console.log(JSON.stringify({ body, empty, errors, order }));
""",
    )
    assert out["body"] == {
        "default": "allow",
        "allow": ["10.0.0.0/8", "example.org", "*.example.org"],
        "deny": ["evil.example.org"],
        "ports": [443, 80, 8080],
        "public_traffic": False,
        "mask_request_host": None,
    }
    assert out["empty"] == {
        "default": "deny",
        "allow": [],
        "deny": [],
        "ports": [],
        "public_traffic": True,
        "mask_request_host": "localhost:${PORT}",
    }
    assert out["errors"] == [
        '"0" is not a port (1–65535)',
        '"65536" is not a port (1–65535)',
        '"44x" is not a port (1–65535)',
        '"-1" is not a port (1–65535)',
    ]
    assert out["order"] == ["c", "b", "a"]


def test_a_put_carries_the_csrf_token_and_a_400_its_message(tmp_path: Path) -> None:
    out = run_module(
        tmp_path,
        """
import { Api, errorText, sbxPath } from "./api.js";
const calls = [];
let reply = { status: 200, body: { id: "sbx 1", network: { default: "deny" } } };
globalThis.fetch = async (path, init) => {
  calls.push({ path, method: init.method, headers: init.headers, body: init.body, credentials: init.credentials });
  const headers = { "content-type": "application/json" };
  return new Response(JSON.stringify(reply.body), { status: reply.status, headers });
};
const api = new Api();
api.setSession({ csrf_token: "tok-123", workspace: "w" });
const ok = await api.put(sbxPath("sbx 1", "/network"), { default: "deny", allow: ["example.org"] });
const refusal = { error: "network.allow.0: bad network '10.0.0.1/8'", code: "invalid_argument", details: {} };
reply = { status: 400, body: refusal };
let message = null;
try { await api.put(sbxPath("sbx 1", "/network"), { default: "deny" }); } catch (err) { message = errorText(err); }
console.log(JSON.stringify({ calls, ok, message }));
""",
    )
    first = out["calls"][0]
    assert first["path"] == "/v1/sandboxes/sbx%201/network"
    assert first["method"] == "PUT"
    assert first["headers"] == {"X-CSRF-Token": "tok-123", "Content-Type": "application/json"}
    assert json.loads(first["body"]) == {"default": "deny", "allow": ["example.org"]}
    assert first["credentials"] == "same-origin"
    assert out["ok"] == {"id": "sbx 1", "network": {"default": "deny"}}
    assert out["message"] == "network.allow.0: bad network '10.0.0.1/8' (invalid_argument, HTTP 400)"


def test_the_sandbox_page_has_the_network_panel() -> None:
    page = (JS / "pages" / "sandbox.js").read_text()
    assert 'import { NetworkPanel } from "../network.js";' in page
    assert "network.load();" in page and "network.el" in page
    script = (JS / "network.js").read_text()
    for testid in (
        "network-policy",
        "network-form",
        "network-form-default",
        "network-form-allow",
        "network-form-deny",
        "network-form-ports",
        "network-form-save",
        "network-form-error",
        "egress-log",
        "egress-row",
    ):
        assert f'testid: "{testid}"' in script, testid
    assert 'this.api.put(sbxPath(this.sandboxId, "/network"), body)' in script
    assert "/egress?limit=${LOG_LIMIT}" in script
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
