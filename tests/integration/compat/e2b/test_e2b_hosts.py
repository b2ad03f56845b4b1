"""Sandbox hosts on real VMs: ``cryobox serve --sandbox-domain cbx.test`` with a wildcard certificate (a test CA's)
serves ``{port}-{id}.cbx.test`` over HTTPS beside its plain listener.

The unmodified E2B SDK runs with only ``E2B_API_URL``, ``E2B_DOMAIN`` and ``E2B_API_KEY`` in a network namespace
whose resolver answers ``*.cbx.test`` with an address relayed to the server's HTTPS port
(:mod:`tests.support.sandbox_domain`): it reaches envd at ``49983-{id}.cbx.test`` and a server in the guest at
``get_host(port)``. Then the same by hand, sending ``Host`` (and SNI) directly: curl over both listeners, and a
WebSocket, with the access rules of the sandbox URL (envd's token, the traffic token, public ports).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.support.paths import APPS
from tests.support.sandbox_domain import DOMAIN, DomainNamespace, Hosted
from tests.support.serve import Client

APP = APPS / "e2b_hosts_app.py"
WS_ECHO = APPS / "ws_echo.py"
HTTP_PORT, WS_PORT = 8000, 8765
PAGE = "<h1>from the guest, by its host</h1>\n"


def test_the_e2b_sdk_needs_only_a_domain(e2b_python: Path, hosted: Hosted) -> None:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    env |= {
        "HOME": str(hosted.serve.data_dir),
        "E2B_API_URL": f"https://api.{DOMAIN}/e2b",
        "E2B_DOMAIN": DOMAIN,
        "E2B_API_KEY": hosted.serve.api_key,
        "SSL_CERT_FILE": str(hosted.authority.file),  # the SDK's TLS (and urllib's) trusts the system's roots
    }
    with DomainNamespace(DOMAIN, hosted.https_port) as ns:
        done = ns.run([str(e2b_python), str(APP)], env=env, timeout=900)
        asked = set(ns.zone.queries)
        assert not ns.errors
    assert done.stdout.strip(), f"no report (rc {done.returncode}): {done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    errors = {k: v["error"] for k, v in report.items() if isinstance(v, dict) and "error" in v}
    assert not errors, json.dumps({k: report[k] for k in errors}, indent=1)
    sid = report["sandbox_id"]
    assert report["domain"] == DOMAIN  # create's domain
    assert report["envd_url"] == f"https://49983-{sid}.{DOMAIN}" and report["host"] == f"{HTTP_PORT}-{sid}.{DOMAIN}"
    assert report["run"] == "out\n" and report["read"] == PAGE and report["list"] == ["index.html"]
    assert report["get_host"] == {"status": 200, "body": PAGE}
    assert report["connect"] == "again\n" and report["kill"] is True
    # every name it looked up was the API's or a sandbox host, each resolved by the namespace's DNS
    assert {f"api.{DOMAIN}", f"49983-{sid}.{DOMAIN}", f"{HTTP_PORT}-{sid}.{DOMAIN}"} <= asked, asked


@pytest.fixture(scope="module")
def serving(hosted: Hosted) -> Iterator[tuple[str, dict[str, str]]]:
    """A sandbox (made with E2B's create: its tokens) running ``http.server`` and a WebSocket echo server."""
    client = Client(hosted.serve.url, hosted.serve.api_key)
    e2b = {"X-API-Key": hosted.serve.api_key}
    made = client.http.post("/e2b/sandboxes", json={"templateID": "base", "timeout": 600}, headers=e2b).json()
    sid = made["sandboxID"]
    client.created.append(sid)
    try:
        client.call("PUT", f"/v1/sandboxes/{sid}/fs", params={"path": "/srv/www/index.html"}, content=PAGE.encode())
        client.call("PUT", f"/v1/sandboxes/{sid}/fs", params={"path": "/root/ws_echo.py"}, content=WS_ECHO.read_bytes())
        client.sh(
            sid,
            f"setsid nohup python3 -m http.server {HTTP_PORT} --directory /srv/www >/dev/null 2>&1 < /dev/null & "
            f"setsid nohup python3 /root/ws_echo.py {WS_PORT} >/dev/null 2>&1 < /dev/null &",
        )
        deadline = time.monotonic() + 90
        url = f"{hosted.serve.url}/v1/sandboxes/{sid}/ports/{HTTP_PORT}/index.html"
        while client.http.get(url).status_code != 200:  # python starts slowly under TCG
            assert time.monotonic() < deadline, "the guest's http.server never came up"
            time.sleep(0.3)
        yield sid, {"envd": made["envdAccessToken"]}
    finally:
        client.close()


def curl(*args: str) -> tuple[int, str]:
    """curl's status code and body (``-w`` puts the code on the last line)."""
    done = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    body, _, code = done.stdout.rpartition("\n")
    return int(code), body


def test_hosts_by_hand_with_the_sandbox_urls_rules(hosted: Hosted, serving: tuple[str, dict[str, str]]) -> None:
    sid, tokens = serving
    base, port = hosted.serve.url, hosted.https_port
    host = f"{HTTP_PORT}-{sid}.{DOMAIN}"
    # HTTPS: the name in the URL, SNI and Host; the wildcard certificate verified against the test CA
    tls = ["--cacert", str(hosted.authority.file), "--resolve", f"{host}:{port}:127.0.0.1"]
    assert curl(*tls, f"https://{host}:{port}/index.html") == (200, PAGE)
    # plain HTTP with only a Host header; upper case, a port and a final dot are the same host
    assert curl("-H", f"Host: {host}", f"{base}/index.html") == (200, PAGE)
    assert curl("-H", f"Host: {host.upper()}.:443", f"{base}/index.html") == (200, PAGE)
    # the Host decides, not E2B's headers; any other host is the API
    lying = ["-H", f"Host: {host}", "-H", "E2b-Sandbox-Port: 49983", "-H", f"X-Access-Token: {tokens['envd']}"]
    assert curl(*lying, f"{base}/index.html") == (200, PAGE)
    assert curl("-H", f"Host: api.{DOMAIN}", f"{base}/healthz") == (200, '{"status":"ok"}')
    # envd: only with the access token
    envd = f"49983-{sid}.{DOMAIN}"
    assert curl("-H", f"Host: {envd}", "-H", f"X-Access-Token: {tokens['envd']}", f"{base}/health")[0] == 204
    assert curl("-H", f"Host: {envd}", f"{base}/health")[0] == 401
    assert curl("-H", f"Host: {envd}", "-H", "X-Access-Token: wrong", f"{base}/health")[0] == 401
    # ports made private: the traffic token (from connect), not nothing
    client = Client(base, hosted.serve.api_key)
    try:
        client.call("PUT", f"/v1/sandboxes/{sid}/network", json={"public_traffic": False})
        e2b = {"X-API-Key": hosted.serve.api_key}
        traffic = client.http.post(f"/e2b/sandboxes/{sid}/connect", json={}, headers=e2b).json()["trafficAccessToken"]
        assert curl("-H", f"Host: {host}", f"{base}/index.html")[0] == 401
        with_token = ["-H", f"Host: {host}", "-H", f"E2b-Traffic-Access-Token: {traffic}"]
        assert curl(*with_token, f"{base}/index.html") == (200, PAGE)
        assert curl("-H", f"Host: {envd}", "-H", f"X-Access-Token: {traffic}", f"{base}/health")[0] == 401
    finally:
        client.call("PUT", f"/v1/sandboxes/{sid}/network", json={"public_traffic": True})
        client.http.close()


def test_a_websocket_by_its_host_over_tls(hosted: Hosted, serving: tuple[str, dict[str, str]]) -> None:
    sid, _ = serving
    host = f"{WS_PORT}-{sid}.{DOMAIN}"
    trust = ssl.create_default_context(cafile=hosted.authority.file)

    async def echo() -> tuple[str, str]:
        url = f"wss://{host}:{hosted.https_port}/echo"  # the name for SNI and Host, the connection to loopback
        async with connect(url, ssl=trust, host="127.0.0.1", port=hosted.https_port, proxy=None) as ws:
            await ws.send("hello by host")
            text = await ws.recv()
            assert ws.response is not None
            return str(text), ws.response.headers.get("X-Seen-Authorization", "")

    assert asyncio.run(echo()) == ("hello by host", "-")
    assert httpx.get(f"{hosted.serve.url}/healthz").status_code == 200  # the plain listener is still the API
