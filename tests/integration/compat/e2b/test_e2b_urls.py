"""Signed file URLs on a real VM, used with plain ``curl`` and no API key: the unmodified E2B SDK's
``download_url``/``upload_url`` (``apps/e2b_urls_app.py``: only the ``E2b-Sandbox-Id`` header a sandbox URL needs),
and cryobox's own ``filesystem.signed_url`` (``/v1/sandboxes/{id}/files/signed``: no header at all). Tampered and
expired URLs are refused and change nothing. One sandbox serves every check."""

from __future__ import annotations

import subprocess
import time
import urllib.parse
from pathlib import Path

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from tests.support.e2b import URLS_APP, assert_urls_report, run_app
from tests.support.serve import Api


def curl(url: str, *args: str) -> tuple[int, str]:
    """``curl`` with no key and no header: the status and the body."""
    cmd = ["curl", "-sS", "--noproxy", "*", "-o", "-", "-w", "\n%{http_code}", *args, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def tamper(url: str, **changes: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = {**dict(urllib.parse.parse_qsl(parts.query)), **changes}
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def test_signed_file_urls_work_with_curl_and_no_key(
    e2b_python: Path, server: ServeProcess, api: Api, tmp_path: Path
) -> None:
    sbx = Sandbox.create(template="base", **api)
    try:
        report = run_app(e2b_python, server.url, server.api_key, server.data_dir, sbx.id, "--wait-expiry", app=URLS_APP)
        assert_urls_report(report)
        assert report["expiry"]["before"] == 200, report["expiry"]
        assert report["expiry"]["after"]["status"] == 401, report["expiry"]

        # cryobox's own: a read URL, a write URL owned by `user`, refusals, then expiry
        read = sbx.filesystem.signed_url("/home/user/signed/up.txt")
        assert read.url.startswith(f"{server.url}/v1/sandboxes/{sbx.id}/files/signed?")
        assert curl(read.url) == (200, "signed upload\n")
        local = tmp_path / "v1.txt"
        local.write_text("from /v1\n")
        write = sbx.filesystem.signed_url("/home/user/signed/v1.txt", "write", user="user", expires_in=2)
        status, body = curl(write.url, "-T", str(local))
        assert status == 200 and '"bytes":9' in body.replace(" ", ""), body
        owned = sbx.exec("stat -c %U /home/user/signed/v1.txt; cat /home/user/signed/v1.txt")
        assert owned.stdout == "user\nfrom /v1\n", owned
        assert curl(tamper(read.url, path="/etc/shadow"))[0] == 401
        assert curl(tamper(write.url, user="root"), "-T", str(local))[0] == 401
        assert curl(read.url, "-T", str(local))[0] == 401  # a read URL does not write
        assert curl(write.url)[0] == 401  # nor a write URL read
        expires = int(dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(write.url).query))["expires"])
        while time.time() < expires + 1.1:
            time.sleep(0.2)
        local.write_text("too late\n")
        assert curl(write.url, "-T", str(local))[0] == 401
        assert sbx.filesystem.read("/home/user/signed/v1.txt") == b"from /v1\n"
    finally:
        sbx.kill()
