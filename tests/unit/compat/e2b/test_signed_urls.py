"""E2B's signed file URLs through the whole app (the gate, ``SandboxAccess`` with the registry's key, the envd app,
``/files`` at the root) with a fake agent; and the unmodified SDK's ``download_url``/``upload_url`` used with plain
``curl`` (``tests/integration/apps/e2b_urls_app.py``, also run on real VMs by the integration tests)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from cryobox.compat.e2b.signing import sign
from cryobox.registry import Registry
from cryobox.server.control.quotas import Quota
from tests.support import e2b_templates
from tests.support.app import Env, app_env, registry
from tests.support.clock import FakeClock
from tests.support.e2b import assert_urls_report
from tests.support.e2b_templates import Served
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture
served = e2b_templates.served
FILE = "/home/user/a.txt"


@dataclass
class Signed:
    env: Env
    clock: FakeClock
    sandbox_id: str
    token: str

    async def get(self, path: str, query: dict[str, str], **headers: str) -> httpx.Response:
        """A request with no key and no token: only the sandbox id header."""
        sent = {"E2b-Sandbox-Id": self.sandbox_id, "Authorization": "", **headers}
        return await self.env.client.get(path, params=query, headers=sent)

    def query(self, file: str, operation: str, expiration: int | None = None, **extra: str) -> dict[str, str]:
        query = {"path": file, "signature": sign(file, operation, "", self.token, expiration)}  # type: ignore[arg-type]
        if expiration is not None:
            query["signature_expiration"] = str(expiration)
        return {**query, **extra}


@pytest.fixture
async def signed(registry: Registry) -> AsyncIterator[Signed]:
    clock = FakeClock(time.time())
    async with app_env(registry, FakeAgent(name="a"), Quota(), clock=clock) as env:
        key = env.client.headers["Authorization"].split()[1]
        made = await env.client.post("/e2b/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": key})
        body = made.json()
        env.agent.files[body["sandboxID"]][FILE] = b"hello"
        yield Signed(env, clock, body["sandboxID"], body["envdAccessToken"])


async def test_a_signed_url_reads_at_the_root_and_under_the_sandbox_url_with_no_key_or_token(signed: Signed) -> None:
    query = signed.query(FILE, "read", int(signed.clock()) + 60)
    for path in ("/files", "/e2b/sandbox/files"):
        got = await signed.get(path, query)
        assert got.status_code == 200 and got.content == b"hello", (path, got.text)
    # /files at the root is envd's whatever the port header says (never a guest port's traffic)
    assert (await signed.get("/files", query, **{"E2b-Sandbox-Port": "8000"})).content == b"hello"


async def test_an_expired_or_foreign_signature_is_refused_before_the_registry_or_the_guest(signed: Signed) -> None:
    before = signed.env.calls("read_file")
    expiring = signed.query(FILE, "read", int(signed.clock()) + 60)
    signed.clock.advance(61)  # one second past its last
    expired = await signed.get("/files", expiring)
    assert expired.status_code == 401 and expired.json() == {"code": 401, "message": "signature is already expired"}
    signed.clock.advance(-61)
    unknown = await signed.get("/files", expiring, **{"E2b-Sandbox-Id": "no-such-sandbox"})
    assert unknown.status_code == 401  # not "not found": the signature is checked first
    write_as_read = await signed.get("/files", signed.query(FILE, "write"))
    assert write_as_read.status_code == 401
    nothing = await signed.get("/files", {"path": FILE})
    assert nothing.status_code == 401 and nothing.json()["code"] == 401  # envd's shape, from the gate
    assert signed.env.calls("read_file") == before
    assert (await signed.get("/files", expiring)).content == b"hello"


async def test_a_signed_upload_at_the_root_writes_and_a_refused_one_writes_nothing(signed: Signed) -> None:
    sent = {"E2b-Sandbox-Id": signed.sandbox_id, "Authorization": ""}
    new = "/home/user/new.txt"
    refused = await signed.env.client.post(
        "/files", params=signed.query(new, "read"), files=[("file", ("x", b"evil"))], headers=sent
    )
    assert refused.status_code == 401 and signed.env.calls("write_file") == 0
    done = await signed.env.client.post(
        "/files", params=signed.query(new, "write"), files=[("file", ("x", b"N"))], headers=sent
    )
    assert done.status_code == 200 and done.json()[0]["path"] == new
    assert signed.env.agent.files[signed.sandbox_id][new] == b"N"


async def test_the_sdks_urls_work_with_curl_and_wrong_ones_are_refused(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}) as client:
        made = await client.post("/v1/sandboxes", json={"template": "base"})
        sandbox_id = made.json()["id"]
    report = await served.app("e2b_urls_app.py", sandbox_id)
    assert_urls_report(report)
    assert "expiry" not in report  # the live expiry waits; the integration test runs it
