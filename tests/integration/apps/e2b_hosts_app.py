"""An application written against E2B's Python SDK (``e2b``, pinned), run unchanged against ``cryobox serve`` set
up as E2B itself is: only ``E2B_API_URL``, ``E2B_DOMAIN`` and ``E2B_API_KEY`` (no sandbox URL), so envd is
``https://49983-{id}.{domain}`` and ``get_host(port)`` is ``{port}-{id}.{domain}``. It trusts the certificate
authority ``SSL_CERT_FILE`` names, as any user of a private CA would. It prints one JSON report; each step that
raises is reported as ``{"error": ...}`` under its name instead of stopping the run."""

from __future__ import annotations

import json
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from e2b import Sandbox

REPORT: dict[str, Any] = {}
PAGE = "<h1>from the guest, by its host</h1>\n"
PORT = 8000


def step(name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as err:  # reported, the run goes on
        REPORT[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=4)}
        return None
    REPORT[name] = value
    return value


def fetch(url: str, deadline_s: float) -> dict[str, Any]:
    """``url`` until it answers 200 (python starts slowly under TCG): its status and body."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                return {"status": response.status, "body": response.read().decode()}
        except (urllib.error.URLError, ConnectionError) as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} never answered: {err}") from err
            time.sleep(0.5)


def main() -> None:
    sbx = Sandbox.create(timeout=600, metadata={"app": "hosts"})
    try:
        REPORT["sandbox_id"] = sbx.sandbox_id
        REPORT["domain"] = sbx.sandbox_domain
        REPORT["envd_url"] = sbx.envd_api_url
        REPORT["host"] = sbx.get_host(PORT)
        step("run", lambda: sbx.commands.run("echo out; echo err >&2").stdout)
        step("write", lambda: sbx.files.write("/tmp/www/index.html", PAGE).path)
        step("read", lambda: sbx.files.read("/tmp/www/index.html"))
        step("list", lambda: [entry.name for entry in sbx.files.list("/tmp/www")])
        step("serve", lambda: sbx.commands.run(f"python3 -m http.server {PORT}", cwd="/tmp/www", background=True).pid)
        step("get_host", lambda: fetch(f"https://{sbx.get_host(PORT)}/index.html", 120))
        step("connect", lambda: Sandbox.connect(sbx.sandbox_id).commands.run("echo again").stdout)
    finally:
        step("kill", sbx.kill)
    print(json.dumps(REPORT))


if __name__ == "__main__":
    try:
        main()
    except Exception as err:  # the create itself: still one report
        print(json.dumps({"create": {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}}))
        sys.exit(1)
