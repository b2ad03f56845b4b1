"""envd's REST routes (``/files``, ``/health``), the port dispatch and the mount prefix of the envd app, over real
HTTP (uvicorn on 127.0.0.1) with httpx, which is what the E2B SDK sends file transfers with."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from cryobox.agentapi.interface import Agent
from cryobox.compat.e2b.envd import EnvdApp, create_envd_app
from cryobox.compat.e2b.envd.multipart import parse
from cryobox.netpolicy import EgressPolicy
from tests.support.envd import HEADERS, SANDBOX, TOKEN, FakeAccess, FakeEnvdAgent, Node, mounted, serve

MAX = 1 << 20
BINARY = bytes(range(256)) * 64 + b"\r\n--boundary\r\n\r\n--" + bytes(range(255, -1, -1))


@dataclass
class FakeForward:
    calls: list[tuple[str, str, int, Agent]] = field(default_factory=list)
    hosts: list[str | None] = field(default_factory=list)
    paths: list[tuple[str, bytes, str, bytes]] = field(default_factory=list)

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        agent: Agent,
        sandbox_id: str,
        port: int,
        *,
        host: str | None = None,
    ) -> None:
        self.calls.append((scope["type"], sandbox_id, port, agent))
        self.hosts.append(host)
        self.paths.append((scope["path"], scope["raw_path"], scope["root_path"], scope["query_string"]))
        body = f"forwarded {scope['path']} to {port}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Env:
    agent: FakeEnvdAgent
    access: FakeAccess
    forward: FakeForward
    app: EnvdApp
    http: httpx.AsyncClient


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    agent = FakeEnvdAgent()
    access = FakeAccess(agent)
    forward = FakeForward()
    app = create_envd_app(access, forward, max_file_bytes=MAX)
    async with serve(mounted(app)) as base, httpx.AsyncClient(base_url=f"{base}/e2b/sandbox", headers=HEADERS) as http:
        yield Env(agent, access, forward, app, http)


def assert_envd_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert body["code"] == status and isinstance(body["message"], str)
    return body


async def test_octet_stream_upload_is_byte_exact_and_resolves_relative_paths(env: Env) -> None:
    response = await env.http.post(
        "/files", params={"path": "dir/b.bin"}, content=BINARY, headers={"Content-Type": "application/octet-stream"}
    )
    assert response.status_code == 200
    assert response.json() == [{"name": "b.bin", "type": "file", "path": "/home/user/dir/b.bin"}]
    assert env.agent.writes == [("/home/user/dir/b.bin", BINARY)]
    response = await env.http.post(
        "/files",
        params={"path": "x", "username": "root"},
        content=gzip.compress(b"zipped"),
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert response.json() == [{"name": "x", "type": "file", "path": "/root/x"}]
    assert env.agent.writes[-1] == ("/root/x", b"zipped")
    assert env.agent.write_users == ["user", "root"]  # what a write creates belongs to the caller's user


async def test_multipart_single_and_multiple_files(env: Env) -> None:
    response = await env.http.post("/files", params={"path": "/tmp/one"}, files=[("file", ("/tmp/one", BINARY))])
    assert response.json() == [{"name": "one", "type": "file", "path": "/tmp/one"}]
    assert env.agent.writes == [("/tmp/one", BINARY)]
    files = [("file", ("a.txt", b"A\r\n")), ("file", ("/abs/b.txt", b"")), ("other", ("c", b"ignored"))]
    response = await env.http.post("/files", files=files)
    assert [e["path"] for e in response.json()] == ["/home/user/a.txt", "/abs/b.txt"]
    assert env.agent.writes[1:] == [("/home/user/a.txt", b"A\r\n"), ("/abs/b.txt", b"")]


async def test_upload_errors(env: Env) -> None:
    duplicate = [("file", ("a", b"1")), ("file", ("a", b"2"))]
    assert_envd_error(await env.http.post("/files", files=duplicate), 400)
    no_path = await env.http.post("/files", content=b"x", headers={"Content-Type": "application/octet-stream"})
    assert_envd_error(no_path, 400)
    assert_envd_error(await env.http.post("/files", content=b"x", headers={"Content-Type": "text/plain"}), 400)
    big = await env.http.post(
        "/files", params={"path": "big"}, content=b"x" * (MAX + 1), headers={"Content-Type": "application/octet-stream"}
    )
    assert_envd_error(big, 413)
    big_part = await env.http.post("/files", params={"path": "big"}, files=[("file", ("big", b"x" * (MAX + 1)))])
    assert_envd_error(big_part, 413)
    bomb = gzip.compress(b"\0" * (MAX + 1))
    zipped = await env.http.post(
        "/files",
        params={"path": "bomb"},
        content=bomb,
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert_envd_error(zipped, 413)
    metadata = await env.http.post(
        "/files", params={"path": "m"}, files=[("file", ("m", b"1"))], headers={"X-Metadata-Owner": "me"}
    )
    assert_envd_error(metadata, 400)
    assert env.agent.writes == []


async def test_download(env: Env) -> None:
    env.agent.nodes["/home/user/f.bin"] = Node("file", BINARY)
    response = await env.http.get("/files", params={"path": "f.bin"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.content == BINARY
    zipped = await env.http.get("/files", params={"path": "/home/user/f.bin"}, headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip" and zipped.content == BINARY
    assert "missing" in assert_envd_error(await env.http.get("/files", params={"path": "missing"}), 404)["message"]
    assert_envd_error(await env.http.get("/files", params={"path": "/home"}), 400)
    assert_envd_error(await env.http.put("/files", params={"path": "x"}), 405)
    assert_envd_error(await env.http.get("/nothing-here"), 404)


async def test_wrong_token_is_401_and_never_reaches_the_agent(env: Env) -> None:
    for headers in ({"X-Access-Token": "wrong"}, {"E2b-Sandbox-Id": "other"}):
        assert_envd_error(await env.http.get("/files", params={"path": "a"}, headers=headers), 401)
        assert_envd_error(
            await env.http.post("/files", params={"path": "a"}, files=[("file", ("a", b"1"))], headers=headers), 401
        )
        assert_envd_error(await env.http.get("/health", headers=headers), 401)
    assert env.agent.calls == []


async def test_health(env: Env) -> None:
    assert (await env.http.get("/health")).status_code == 204
    assert env.access.opened[-1] == (SANDBOX, False), "the health probe does not wake a hibernated sandbox"
    gone = await env.http.get("/health", headers={"E2b-Sandbox-Id": "sbx-gone", "X-Access-Token": "token-gone"})
    assert "was not found" in assert_envd_error(gone, 502)["message"]
    env.access.status = "hibernated"
    assert "was not found" in assert_envd_error(await env.http.get("/health"), 502)["message"]
    assert_envd_error(await env.http.get("/files", params={"path": "a"}), 502)


async def test_a_policys_host_mask_goes_to_the_forward(env: Env) -> None:
    traffic = {"E2b-Sandbox-Port": "3000", "X-Access-Token": TOKEN}
    assert (await env.http.get("/", headers=traffic)).status_code == 200
    env.access.egress = EgressPolicy(mask_request_host="${PORT}-app.example.org")
    assert (await env.http.get("/", headers=traffic)).status_code == 200
    assert env.forward.hosts == [None, "3000-app.example.org"]


async def test_other_ports_go_to_the_forward(env: Env) -> None:
    response = await env.http.get("/some/page", headers={"E2b-Sandbox-Port": "8080"})
    assert response.text == "forwarded /some/page to 8080"
    assert [(kind, sid, port) for kind, sid, port, _ in env.forward.calls] == [("http", SANDBOX, 8080)]
    assert env.forward.calls[0][3] is cast(object, env.agent)
    await env.http.get("/a%20b", params={"q": "1"}, headers={"E2b-Sandbox-Port": "8080"})
    assert env.forward.paths[-1] == ("/a b", b"/a%20b", "", b"q=1")
    traffic = {"E2b-Sandbox-Port": "3000", "X-Access-Token": "", "E2b-Traffic-Access-Token": "token-1"}
    assert (await env.http.get("/", headers=traffic)).status_code == 200
    assert_envd_error(await env.http.get("/", headers={"E2b-Sandbox-Port": "3000", "X-Access-Token": "no"}), 401)
    assert_envd_error(await env.http.get("/", headers={"E2b-Sandbox-Port": "99999"}), 400)
    gone = {"E2b-Sandbox-Port": "3000", "E2b-Sandbox-Id": "sbx-gone", "X-Access-Token": "token-gone"}
    assert_envd_error(await env.http.get("/", headers=gone), 502)
    assert len(env.forward.calls) == 3


@pytest.mark.parametrize("mount", ["mounted", "raw-with-prefix", "raw-at-root"])
async def test_paths_with_and_without_the_mount_prefix(mount: str) -> None:
    agent = FakeEnvdAgent()
    app = create_envd_app(FakeAccess(agent), FakeForward())
    served = mounted(app) if mount == "mounted" else app
    base = "" if mount == "raw-at-root" else "/e2b/sandbox"
    async with serve(served) as url, httpx.AsyncClient(base_url=url + base, headers=HEADERS) as http:
        assert (await http.get("/health")).status_code == 204
        response = await http.post("/process.Process/List", content=b"{}", headers={"Content-Type": "application/json"})
        assert response.status_code == 200 and response.json() == {}


def test_multipart_parser_edges() -> None:
    body = (
        b"preamble\r\n--XyZ\r\n"
        b'Content-Disposition: form-data; name="file"; filename="a \\"q\\".txt"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
        b"line1\r\n--XyZnot-a-boundary\r\n"
        b"\r\n--XyZ\r\n"
        b"Content-Disposition: form-data; name=file; filename*=UTF-8''%C3%A9t%C3%A9.txt\r\n\r\n"
        b"\r\n--XyZ\r\n"
        b"\r\nno headers\r\n--XyZ--\r\nepilogue"
    )
    parts = parse(body, 'multipart/form-data; boundary="XyZ"')
    assert [(p.name, p.filename, p.content) for p in parts] == [
        ("file", 'a "q".txt', b"line1\r\n--XyZnot-a-boundary\r\n"),
        ("file", "été.txt", b""),
        (None, None, b"no headers"),
    ]
    for bad_body, content_type in (
        (b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nunterminated", "multipart/form-data; boundary=XyZ"),
        (b"no boundary here", "multipart/form-data; boundary=XyZ"),
        (b"--XyZ--", "multipart/form-data"),
    ):
        with pytest.raises(Exception, match="multipart"):
            parse(bad_body, content_type)
