"""Signed file URLs of the ``/v1`` API (``POST /v1/sandboxes/{id}/files/url``, ``GET``/``PUT …/files/signed``,
``server/access/fileurls.py``) through the app with a fake agent and the SDK's ``filesystem.signed_url``: the URL
works with no key, is refused (401, before the guest or the body is read) once tampered with, used for the other
operation or expired on the control plane's clock, and the request's mistakes are 400s naming the field."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from cryobox import AsyncSandbox
from cryobox.errors import InvalidArgument, Unauthorized
from cryobox.registry import Registry
from cryobox.server.access.fileurls import FileGrant, check
from cryobox.server.control.quotas import Quota
from cryobox.util.sealing import Sealer, generate_key
from tests.support.app import Env, app_env, registry
from tests.support.clock import FakeClock
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture
FILE = "/data/report.csv"


@dataclass
class Urls:
    env: Env
    clock: FakeClock
    sandbox: AsyncSandbox
    anonymous: httpx.AsyncClient
    """The app with no API key."""

    def reads(self) -> int:
        return self.env.calls("read_file")

    def writes(self) -> int:
        return self.env.calls("write_file")


@pytest.fixture
async def urls(registry: Registry) -> AsyncIterator[Urls]:
    clock = FakeClock(time.time())
    async with app_env(registry, FakeAgent(name="a"), Quota(), clock=clock) as env:
        sandbox_id = await env.made()
        env.agent.files[sandbox_id][FILE] = b"a,b\n"
        key = env.client.headers["Authorization"].split()[1]
        sandbox = await AsyncSandbox.connect(sandbox_id, api_url="http://ctl", api_key=key, http=env.client)
        async with httpx.AsyncClient(transport=env.transport, base_url="http://ctl") as anonymous:
            yield Urls(env, clock, sandbox, anonymous)


def tamper(url: str, **changes: str | None) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


async def test_a_read_url_and_a_write_url_work_with_no_key(urls: Urls) -> None:
    read = await urls.sandbox.filesystem.signed_url(FILE, expires_in=120)
    sid = urls.sandbox.id
    assert read.method == "GET" and read.url.startswith(f"http://ctl/v1/sandboxes/{sid}/files/signed?")
    assert read.expires_at.endswith("Z") and "signature=" in read.url
    got = await urls.anonymous.get(read.url)
    assert got.status_code == 200 and got.content == b"a,b\n"
    write = await urls.sandbox.filesystem.signed_url("/data/new.bin", "write", user="user")
    assert write.method == "PUT" and "user=user" in write.url
    put = await urls.anonymous.put(write.url, content=b"\x00\xff")
    assert put.status_code == 200 and put.json() == {"path": "/data/new.bin", "bytes": 2}
    assert urls.env.agent.files[sid]["/data/new.bin"] == b"\x00\xff"
    assert ("write_file", (sid, "/data/new.bin", 2)) in urls.env.agent.calls


async def test_tampered_swapped_and_expired_urls_are_401s_that_touch_nothing(urls: Urls) -> None:
    read = (await urls.sandbox.filesystem.signed_url(FILE, expires_in=60)).url
    write = (await urls.sandbox.filesystem.signed_url(FILE, "write", user="user", expires_in=60)).url
    reads, writes = urls.reads(), urls.writes()
    expires = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(read).query))["expires"]
    bad_reads = [
        tamper(read, path="/etc/shadow"),
        tamper(read, expires=str(int(expires) + 3600)),
        tamper(read, signature="x" + dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(read).query))["signature"]),
        read.replace(urls.sandbox.id, await urls.env.made()),  # another sandbox (same workspace)
        write,  # a write URL on a GET
    ]
    for url in bad_reads:
        response = await urls.anonymous.get(url)
        assert response.status_code == 401, (url, response.text)
    unsigned = await urls.anonymous.get(tamper(read, signature=None))
    assert unsigned.status_code == 400 and "signature" in unsigned.text
    for url in (tamper(write, user="root"), tamper(write, user=None), read):  # a read URL on a PUT
        response = await urls.anonymous.put(url, content=b"evil")
        assert response.status_code == 401, (url, response.text)
    urls.clock.advance(61)  # a second past the last one
    expired = await urls.anonymous.get(read)
    assert expired.status_code == 401 and expired.json()["code"] == "unauthorized" and "expired" in expired.text
    assert (await urls.anonymous.put(write, content=b"late")).status_code == 401
    assert (urls.reads(), urls.writes()) == (reads, writes)
    assert urls.env.agent.files[urls.sandbox.id][FILE] == b"a,b\n"
    urls.clock.advance(-1)  # its last second still counts
    assert (await urls.anonymous.get(read)).content == b"a,b\n"


async def test_the_request_is_checked_naming_what_is_wrong(urls: Urls) -> None:
    post = f"/v1/sandboxes/{urls.sandbox.id}/files/url"
    cases = {
        "colour": {"path": FILE, "operation": "read", "colour": "red"},
        "operation": {"path": FILE, "operation": "download"},
        "expires_in": {"path": FILE, "operation": "read", "expires_in": 7 * 24 * 3600 + 1},
        "user": {"path": FILE, "operation": "read", "user": "root"},  # a read has no owner
        "path": {"path": "relative.txt", "operation": "read"},
    }
    for field, body in cases.items():
        response = await urls.env.client.post(post, json=body)
        assert response.status_code == 400 and field in response.text, (field, response.text)
    assert (
        await urls.env.client.post(post, json={"path": FILE, "operation": "read", "expires_in": 0})
    ).status_code == 400
    missing = await urls.env.client.post("/v1/sandboxes/nope/files/url", json={"path": FILE, "operation": "read"})
    assert missing.status_code == 404
    no_key = await urls.anonymous.post(post, json={"path": FILE, "operation": "read"})
    assert no_key.status_code == 401
    read = (await urls.sandbox.filesystem.signed_url(FILE)).url
    extra = await urls.anonymous.get(read + "&debug=1")
    assert extra.status_code == 400 and "debug" in extra.text
    with pytest.raises(InvalidArgument, match="user"):
        await urls.sandbox.filesystem.signed_url(FILE, user="root")


def test_a_grant_is_checked_under_every_listed_key() -> None:
    old, new = generate_key(), generate_key()
    grant = FileGrant("sbx-1", "write", "/a", 1000, "user")
    signature = grant.query(Sealer.from_keys(old))["signature"]
    check(Sealer.from_keys(f"{new},{old}"), grant, signature, 999.5)  # still listed: still good
    for other in (
        FileGrant("sbx-2", "write", "/a", 1000, "user"),
        FileGrant("sbx-1", "read", "/a", 1000, "user"),
        FileGrant("sbx-1", "write", "/a", 1000, None),
        FileGrant("sbx-1", "write", "/a", 1001, "user"),
    ):
        assert other.query(Sealer.from_keys(old))["signature"] != signature
    with pytest.raises(Unauthorized, match="invalid file URL signature"):
        check(Sealer.from_keys(new), grant, signature, 999.5)
