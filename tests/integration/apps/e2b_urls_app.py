"""Signed file URLs of E2B's Python SDK (``e2b``, pinned), unchanged, against cryobox: the SDK builds
``upload_url``/``download_url`` for the sandbox named on the command line (``Sandbox.connect``), and plain ``curl``
uses them with no API key and no access token, only the ``E2b-Sandbox-Id`` header a sandbox URL needs. Tampered,
swapped, stripped and expired ones must be refused with nothing read or written.

``e2b_urls_app.py SANDBOX_ID [--wait-expiry]``: with ``--wait-expiry`` also a URL good for 2 s, used, then (after
waiting out its last second) refused. Run in the SDK's own virtualenv with ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY`` set; prints one JSON report (each step's result, or ``{"error": ...}`` if it raised) as its last
line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2b import Sandbox

REPORT: dict[str, Any] = {}
BASE = "/home/user/signed"
CONTENT = "signed upload\n"


def step(name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as err:  # reported, the run goes on
        REPORT[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=4)}
        return None
    REPORT[name] = value
    return value


class Curl:
    """``curl`` with the sandbox id header only (no key, no token), never through a proxy."""

    def __init__(self, sandbox_id: str, scratch: Path) -> None:
        self.sandbox_id = sandbox_id
        self.scratch = scratch

    def __call__(self, url: str, *args: str) -> dict[str, Any]:
        out = self.scratch / "body"
        cmd = ["curl", "-sS", "--noproxy", "*", "-o", str(out), "-w", "%{http_code}"]
        cmd += ["-H", f"E2b-Sandbox-Id: {self.sandbox_id}", *args, url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        body = out.read_bytes().decode(errors="replace") if out.exists() else ""
        out.unlink(missing_ok=True)
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body
        return {"status": int(done.stdout), "body": parsed}

    def upload(self, url: str, content: str, *args: str) -> dict[str, Any]:
        """A multipart upload, as the SDK's ``upload_url`` documents it."""
        local = self.scratch / "upload.txt"
        local.write_text(content)
        return self(url, "-F", f"file=@{local};filename=upload.txt", *args)


def with_query(url: str, **changes: str | None) -> str:
    """``url`` with query parameters changed (``None`` removes one), in the SDK's encoding."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    encoded = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    return urllib.parse.urlunsplit(parts._replace(query=encoded))


def param(url: str, name: str) -> str:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))[name]


def refused(curl: Curl, sbx: Sandbox) -> None:
    """Every wrong URL is a 401 in envd's shape; what refused uploads aimed at is untouched."""
    down = sbx.download_url(f"{BASE}/up.txt")
    step("tampered_path", lambda: curl(with_query(down, path=f"{BASE}/raw.bin")))
    as_root = sbx.download_url(f"{BASE}/up.txt", user="root")
    step("tampered_user", lambda: curl(with_query(as_root, username="user")))
    flipped = param(down, "signature")[:-1] + ("A" if param(down, "signature")[-1] != "A" else "B")
    step("tampered_signature", lambda: curl(with_query(down, signature=flipped)))
    expiring = sbx.download_url(f"{BASE}/up.txt", use_signature_expiration=600)
    later = str(int(param(expiring, "signature_expiration")) + 1)
    step("tampered_expiration", lambda: curl(with_query(expiring, signature_expiration=later)))
    step("expiration_removed", lambda: curl(with_query(expiring, signature_expiration=None)))
    step("bad_expiration", lambda: curl(with_query(expiring, signature_expiration="soon")))
    step("no_signature", lambda: curl(with_query(down, signature=None)))
    step("wrong_token_header", lambda: curl(down, "-H", "X-Access-Token: wrong"))
    upload_for_down = sbx.upload_url(f"{BASE}/up.txt")
    step("upload_url_for_download", lambda: curl(upload_for_down))
    step("download_url_for_upload", lambda: curl.upload(down, "overwritten"))
    step("expired_download", lambda: curl(sbx.download_url(f"{BASE}/up.txt", use_signature_expiration=-1)))
    expired_up = sbx.upload_url(f"{BASE}/late.txt", use_signature_expiration=-1)
    step("expired_upload", lambda: curl.upload(expired_up, "too late"))
    step("after_refusals", lambda: sbx.files.read(f"{BASE}/up.txt"))
    step("late_written", lambda: _exists(sbx, f"{BASE}/late.txt"))


def _exists(sbx: Sandbox, path: str) -> bool | str:
    try:
        sbx.files.read(path)
    except Exception as err:
        return type(err).__name__
    return True


def expiry(curl: Curl, sbx: Sandbox) -> dict[str, Any]:
    """A URL good for 2 s works, then (its second past) is refused."""
    url = sbx.download_url(f"{BASE}/up.txt", use_signature_expiration=2)
    first = curl(url)
    until = int(param(url, "signature_expiration")) + 1.1
    while time.time() < until:
        time.sleep(0.2)
    return {"before": first["status"], "after": curl(url)}


def main() -> int:
    sandbox_id, wait = sys.argv[1], "--wait-expiry" in sys.argv[2:]
    try:
        sbx = Sandbox.connect(sandbox_id)
        with tempfile.TemporaryDirectory() as scratch:
            curl = Curl(sandbox_id, Path(scratch))
            up = step("upload_url", lambda: sbx.upload_url(f"{BASE}/up.txt"))
            step("upload", lambda: curl.upload(up, CONTENT))
            step("download_url", lambda: sbx.download_url(f"{BASE}/up.txt"))
            step("download", lambda: curl(REPORT["download_url"]))
            raw = sbx.upload_url(f"{BASE}/raw.bin", use_signature_expiration=600)
            step(
                "upload_raw",
                lambda: curl(raw, "--data-binary", "raw bytes", "-H", "Content-Type: application/octet-stream"),
            )
            step("read_raw", lambda: sbx.files.read(f"{BASE}/raw.bin"))
            step("download_relative", lambda: curl(sbx.download_url("signed/up.txt", user="user")))
            prefixed = REPORT["download_url"].replace("/files?", "/e2b/sandbox/files?", 1)
            step("download_under_sandbox_url", lambda: curl(prefixed))
            refused(curl, sbx)
            if wait:  # seconds of real time: the integration test's
                step("expiry", lambda: expiry(curl, sbx))
    except Exception as err:
        REPORT["fatal"] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=6)}
    finally:
        print(json.dumps(REPORT, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
