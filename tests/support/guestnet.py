"""What a guest reaches by name, asked from inside it (its resolver, its egress proxy): for tests on real VMs."""

from __future__ import annotations

import json
import shlex

from tests.support.serve import Client

FETCH = """\
import json, sys, urllib.request
out = {}
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=8) as r:
            out[url] = json.loads(r.read())["host"]
    except Exception as e:
        out[url] = "error"
print(json.dumps(out))
"""
URLS = ["http://example.org/", "http://cdn-a.example.net/", "http://cdn-b.example.net/", "http://other.example.com/"]


def reached(client: Client, sandbox_id: str) -> set[str]:
    """The names among URLS the guest reached (by name: resolved by its name server, through its proxy)."""
    out = client.sh(sandbox_id, " ".join(["python3 -c", shlex.quote(FETCH), *URLS]), timeout=90)
    got: dict[str, str] = json.loads(out)
    return {url.split("/")[2] for url, host in got.items() if host != "error" and host == url.split("/")[2]}
