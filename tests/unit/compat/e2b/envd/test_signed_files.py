"""envd's file routes with signed URLs instead of the access token (``compat/e2b/signing.py``), over real HTTP: the
route hands the signed fields (the raw ``path``, the operation its method means, the raw ``username``) to the opener,
which checks them on its clock; a refused request reaches neither the opener's sandbox nor the agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from cryobox.compat.e2b.envd import create_envd_app
from cryobox.compat.e2b.signing import sign
from tests.support.envd import SANDBOX, TOKEN, FakeAccess, FakeEnvdAgent, Node, mounted, no_forward, serve

NOW = 1_700_000_000.0
OCTET = {"Content-Type": "application/octet-stream"}


@dataclass
class Env:
    agent: FakeEnvdAgent
    access: FakeAccess
    http: httpx.AsyncClient
    """No token: only the sandbox id header."""


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    agent = FakeEnvdAgent()
    agent.nodes["/home/user/a.txt"] = Node("file", b"hello")
    access = FakeAccess(agent)
    access.clock = lambda: NOW
    app = create_envd_app(access, no_forward)
    headers = {"E2b-Sandbox-Id": SANDBOX}
    async with serve(mounted(app)) as base, httpx.AsyncClient(base_url=f"{base}/e2b/sandbox", headers=headers) as http:
        yield Env(agent, access, http)


def signed(path: str, operation: str, user: str | None = None, expiration: int | None = None) -> dict[str, str]:
    """The query the SDK's ``download_url``/``upload_url`` makes."""
    query = {"path": path} if path else {}
    if user:
        query["username"] = user
    query["signature"] = sign(path, operation, user or "", TOKEN, expiration)  # type: ignore[arg-type]
    if expiration is not None:
        query["signature_expiration"] = str(expiration)
    return query


def refused(response: httpx.Response, status: int = 401) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status
    return str(body["message"])


async def test_signed_download_and_upload_need_no_token(env: Env) -> None:
    got = await env.http.get("/files", params=signed("a.txt", "read"))
    assert got.status_code == 200 and got.content == b"hello"
    as_root = await env.http.get("/files", params=signed("/home/user/a.txt", "read", "root", int(NOW) + 60))
    assert as_root.content == b"hello"
    raw = await env.http.post(
        "/files", params=signed("b.bin", "write", expiration=int(NOW)), content=b"B", headers=OCTET
    )
    assert raw.status_code == 200 and raw.json()[0]["path"] == "/home/user/b.bin"  # its last second still counts
    parts = await env.http.post("/files", params=signed("c.txt", "write", "root"), files=[("file", ("x", b"C"))])
    assert parts.status_code == 200 and parts.json()[0]["path"] == "/root/c.txt"
    assert env.agent.writes == [("/home/user/b.bin", b"B"), ("/root/c.txt", b"C")]
    assert env.agent.write_users == ["user", "root"]


async def test_wrong_signatures_are_401s_before_anything_is_opened_read_or_written(env: Env) -> None:
    good = signed("a.txt", "read", expiration=int(NOW) + 60)
    cases = {
        "expired by 1 s": signed("a.txt", "read", expiration=int(NOW) - 1),
        "path": {**good, "path": "b.txt"},
        "user": {**good, "username": "root"},
        "expiration": {**good, "signature_expiration": str(int(NOW) + 61)},
        "expiration dropped": {k: v for k, v in good.items() if k != "signature_expiration"},
        "signature": {**good, "signature": good["signature"][:-2]},
        "an upload's signature": signed("a.txt", "write", expiration=int(NOW) + 60),
        "no signature": {"path": "a.txt"},
    }
    for name, query in cases.items():
        message = refused(await env.http.get("/files", params=query))
        assert "expired" in message if name.startswith("expired") else "expired" not in message, name
    upload = {
        "a download's signature": signed("new.txt", "read"),
        "expired": signed("new.txt", "write", expiration=int(NOW) - 1),
        "another file": {**signed("new.txt", "write"), "path": "/home/user/a.txt"},
    }
    for query in upload.values():
        refused(await env.http.post("/files", params=query, content=b"evil", headers=OCTET))
        refused(await env.http.post("/files", params=query, files=[("file", ("new.txt", b"evil"))]))
    assert env.agent.calls == [] and env.access.opened == []
    assert env.agent.nodes["/home/user/a.txt"].data == b"hello"


async def test_a_token_decides_alone_and_a_bad_expiration_is_a_400(env: Env) -> None:
    query = signed("a.txt", "read")
    refused(await env.http.get("/files", params=query, headers={"X-Access-Token": "wrong"}))
    with_token = await env.http.get("/files", params={"path": "a.txt"}, headers={"X-Access-Token": TOKEN})
    assert with_token.content == b"hello"
    bad = {**query, "signature_expiration": "tomorrow"}
    assert "signature_expiration" in refused(await env.http.get("/files", params=bad), 400)
    other_sandbox = await env.http.get("/files", params=query, headers={"E2b-Sandbox-Id": "sbx-other"})
    refused(other_sandbox)
    assert env.agent.calls == ["read_file"]
