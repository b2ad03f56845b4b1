"""E2B's JavaScript SDK (npm ``e2b``, pinned), unchanged, against ``cryobox serve --sandbox-domain cbx.test`` set up
as E2B itself is: only ``E2B_API_URL``, ``E2B_DOMAIN`` and ``E2B_API_KEY`` (no ``E2B_SANDBOX_URL``), and node's own
``NODE_EXTRA_CA_CERTS`` naming the test CA. The SDK reaches envd at ``https://49983-{id}.cbx.test`` — over TLS,
where its undici agent offers HTTP/2 and the server's listener answers HTTP/1.1 — and a server in the guest at
``getHost(port)``; run in the network namespace whose resolver answers ``*.cbx.test`` with a relay to the server's
HTTPS port (:mod:`tests.support.sandbox_domain`, the ``hosted`` server of tests/integration/compat/conftest.py).
"""

from __future__ import annotations

import json

from tests.support.e2b_js import node_app_env
from tests.support.node import E2B_JS, NODE
from tests.support.sandbox_domain import DOMAIN, DomainNamespace, Hosted

PAGE = "<h1>from the guest, by its host</h1>\n"


def test_the_e2b_js_sdk_needs_only_a_domain(hosted: Hosted) -> None:
    env = node_app_env(hosted.serve.url, hosted.serve.api_key, hosted.serve.data_dir)
    del env["E2B_SANDBOX_URL"]
    env |= {
        "E2B_API_URL": f"https://api.{DOMAIN}/e2b",
        "E2B_DOMAIN": DOMAIN,
        "E2B_VOLUME_API_URL": f"https://api.{DOMAIN}/e2b",
        "NODE_EXTRA_CA_CERTS": str(hosted.authority.file),
    }
    with DomainNamespace(DOMAIN, hosted.https_port) as ns:
        done = ns.run([str(NODE), str(E2B_JS / "e2b_hosts_app.mjs")], env=env, timeout=600)
        asked = set(ns.zone.queries)
        assert not ns.errors
    assert done.stdout.strip(), f"no report (rc {done.returncode}): {done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fatal" not in report, report["fatal"]
    errors = {k: v for k, v in report.items() if isinstance(v, dict) and "error" in v}
    assert not errors, json.dumps(errors, indent=1)
    sid = report["sandbox_id"]
    assert report["domain"] == DOMAIN
    assert report["envd_url"] == f"https://49983-{sid}.{DOMAIN}" and report["host"] == f"8000-{sid}.{DOMAIN}"
    assert report["run"] == "out\n" and report["on_stdout"] == "a\nb\n"
    assert report["read"] == PAGE and report["list"] == ["index.html"]
    assert report["signed_urls"] == {  # the sandbox's own host: no key, no token, no header
        "host": f"49983-{sid}.{DOMAIN}",
        "upload": 200,
        "download": 200,
        "body": "signed upload\n",
        "unsigned": 401,
    }
    assert report["watch"] is True and report["pty"] is True
    assert report["get_host"] == {"status": 200, "body": PAGE}
    assert report["connect"] == "again\n" and report["kill"] is True
    # every name it looked up was the API's or a sandbox host, each resolved by the namespace's DNS
    assert {f"api.{DOMAIN}", f"49983-{sid}.{DOMAIN}", f"8000-{sid}.{DOMAIN}"} <= asked, asked
