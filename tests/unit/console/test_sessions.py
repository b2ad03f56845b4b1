"""The console's cookie sessions over the real app (fake agent, SQLite registry): login, the cookie's flags,
CSRF on writes, logout, a revoked key, the key never in a URL, and the static files with their CSP."""

from __future__ import annotations

import httpx
import pytest

from cryobox.console.static import CSP
from cryobox.registry import Registry
from cryobox.registry.sessions import SessionRecords
from cryobox.server.access.sessions import COOKIE_NAME, ConsoleSessions, csrf_for
from tests.support import registry as registry_support
from tests.support.clock import FakeClock
from tests.support.console import ConsoleEnv, console_env

registry = registry_support.sqlite_registry
clock = registry_support.clock
__all__ = ["console_env", "registry"]


def set_cookie(response: httpx.Response) -> str:
    headers = response.headers.get_list("set-cookie")
    assert len(headers) == 1, headers
    return headers[0]


async def test_login_sets_an_httponly_strict_cookie_without_the_key(console_env: ConsoleEnv) -> None:
    response = await console_env.client.post("/ui/login", json={"api_key": console_env.key})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["workspace"] == "alpha" and len(body["csrf_token"]) == 64
    cookie = set_cookie(response)
    parts = [p.strip() for p in cookie.split(";")]
    name, _, value = parts[0].partition("=")
    assert name == COOKIE_NAME and len(value) >= 40
    flags = {p.lower() for p in parts[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    assert "secure" not in flags  # plain http here; https adds it
    assert console_env.key not in cookie and console_env.key[4:20] not in value
    assert body["csrf_token"] == csrf_for(value) and body["csrf_token"] != value
    assert response.headers["cache-control"] == "no-store"


async def test_login_over_https_marks_the_cookie_secure(console_env: ConsoleEnv) -> None:
    response = await console_env.client.post("https://ctl/ui/login", json={"api_key": console_env.key})
    assert response.status_code == 200
    assert "secure" in {p.strip().lower() for p in set_cookie(response).split(";")}


@pytest.mark.parametrize("key", ["cbx_wrong", "nope"])
async def test_a_bad_key_is_401_in_the_api_shape_with_no_cookie(console_env: ConsoleEnv, key: str) -> None:
    response = await console_env.client.post("/ui/login", json={"api_key": key})
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized" and response.json()["error"]
    assert "set-cookie" not in response.headers
    assert (await console_env.client.get("/ui/session")).status_code == 401


async def test_bad_logins_count_against_the_address(console_env: ConsoleEnv) -> None:
    for _ in range(20):
        assert (await console_env.client.post("/ui/login", json={"api_key": "cbx_bad"})).status_code == 401
    response = await console_env.client.post("/ui/login", json={"api_key": console_env.key})
    assert response.status_code == 429 and response.json()["code"] == "auth_rate_limited"


async def test_the_session_reads_like_the_key_and_writes_need_the_csrf_header(console_env: ConsoleEnv) -> None:
    client = console_env.client
    assert (await client.get("/v1/sandboxes")).status_code == 401  # nothing yet
    csrf = await console_env.login()
    session = await client.get("/ui/session")
    assert session.status_code == 200 and session.json() == {"workspace": "alpha", "csrf_token": csrf}
    assert (await client.get("/v1/sandboxes")).json() == {"items": []}

    refused = await client.post("/v1/sandboxes", json={"template": "base"})
    assert refused.status_code == 403 and refused.json()["code"] == "csrf"
    wrong = await client.post("/v1/sandboxes", json={"template": "base"}, headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403 and wrong.json()["code"] == "csrf"
    assert console_env.registry.list_sandboxes(console_env.workspace_id) == []  # nothing was created

    made = await client.post("/v1/sandboxes", json={"template": "base"}, headers={"X-CSRF-Token": csrf})
    assert made.status_code == 201, made.text
    sandbox_id = made.json()["id"]
    listed = (await client.get("/v1/sandboxes")).json()["items"]
    assert [s["id"] for s in listed] == [sandbox_id]
    deleted = await client.delete(f"/v1/sandboxes/{sandbox_id}", headers={"X-CSRF-Token": csrf})
    assert deleted.status_code == 204


async def test_logout_ends_the_session_and_the_old_cookie_stops_working(console_env: ConsoleEnv) -> None:
    client = console_env.client
    csrf = await console_env.login()
    stolen = client.cookies[COOKIE_NAME]
    without = await client.post("/ui/logout")
    assert without.status_code == 403 and without.json()["code"] == "csrf"  # a live session needs its token
    out = await client.post("/ui/logout", headers={"X-CSRF-Token": csrf})
    assert out.status_code == 204
    cleared = set_cookie(out).lower()
    assert cleared.startswith(f"{COOKIE_NAME}=") and ("max-age=0" in cleared or "expires=" in cleared)
    client.cookies.set(COOKIE_NAME, stolen)  # the old cookie, replayed
    assert (await client.get("/v1/sandboxes")).status_code == 401
    assert (await client.get("/ui/session")).status_code == 401
    again = await client.post("/ui/logout")  # no live session: only clears the cookie
    assert again.status_code == 204


async def test_revoking_the_key_ends_its_sessions(console_env: ConsoleEnv) -> None:
    await console_env.login()
    assert (await console_env.client.get("/v1/sandboxes")).status_code == 200
    console_env.registry.revoke_key(console_env.key_id)
    response = await console_env.client.get("/v1/sandboxes")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"
    assert (await console_env.client.get("/ui/session")).status_code == 401


async def test_the_key_is_never_taken_from_a_url(console_env: ConsoleEnv) -> None:
    client = console_env.client
    for url in (
        f"/v1/sandboxes?api_key={console_env.key}",
        f"/v1/sandboxes?key={console_env.key}",
        f"/ui/api/events?api_key={console_env.key}",
    ):
        assert (await client.get(url)).status_code == 401, url
    response = await client.post(f"/ui/login?api_key={console_env.key}", json={"api_key": console_env.key})
    assert response.status_code == 400 and "set-cookie" not in response.headers
    assert (await client.post(f"/ui/login?api_key={console_env.key}")).status_code == 400


async def test_a_cookie_does_not_count_outside_the_console_and_v1(console_env: ConsoleEnv) -> None:
    await console_env.login()
    assert (await console_env.client.get("/e2b/sandboxes")).status_code == 401


async def test_bearer_auth_is_unchanged_and_needs_no_csrf(console_env: ConsoleEnv) -> None:
    headers = {"Authorization": f"Bearer {console_env.key}"}
    async with httpx.AsyncClient(transport=console_env.client._transport, base_url="http://ctl") as bare:
        made = await bare.post("/v1/sandboxes", json={"template": "base"}, headers=headers)
        assert made.status_code == 201, made.text


async def test_a_rate_limit_applies_to_cookie_requests(registry: Registry) -> None:
    from tests.support.console import make_env

    async for env in make_env(registry, {"CRYOBOX_RATE_LIMIT_PER_S": "1", "CRYOBOX_RATE_LIMIT_BURST": "3"}):
        await env.login()
        codes = [(await env.client.get("/v1/sandboxes")).status_code for _ in range(6)]
        assert 429 in codes and codes[0] == 200


async def test_the_static_app_is_served_with_a_strict_csp(console_env: ConsoleEnv) -> None:
    for path in ("/ui", "/ui/", "/ui/index.html"):
        response = await console_env.client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert "<html" in response.text
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP and "frame-ancestors 'none'" in CSP
    missing = await console_env.client.get("/ui/nope.js")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert missing.headers["content-security-policy"] == CSP
    escape = await console_env.client.get("/ui/..%2f..%2fpyproject.toml")
    assert escape.status_code == 404
    api = await console_env.client.get("/ui/session")
    assert api.headers["x-content-type-options"] == "nosniff"  # every /ui response


def test_sessions_are_cached_like_keys_and_slide(registry: Registry, clock: FakeClock) -> None:
    ws = registry.ensure_workspace("beta").id
    info, key = registry.create_key(ws)
    sessions = ConsoleSessions(SessionRecords(registry.database), ttl_s=3600.0, cache_s=5.0, clock=clock)
    made = sessions.login(key)
    assert made is not None and made.session.workspace.name == "beta"
    assert sessions.login("cbx_" + "x" * 40) is None
    assert sessions.authenticate(made.token) is not None
    registry.revoke_key(info.id)
    assert sessions.authenticate(made.token) is not None  # cached: within the key cache's 5 s
    clock.now += 5.1
    assert sessions.authenticate(made.token) is None  # the revoked key ended it

    _, other = registry.create_key(ws)
    live = sessions.login(other)
    assert live is not None
    for _ in range(6):  # used every 10 minutes for an hour: the expiry slides
        clock.now += 600
        assert sessions.authenticate(live.token) is not None
    clock.now += 3601  # unused past its lifetime: gone
    assert sessions.authenticate(live.token) is None
    sessions2 = ConsoleSessions(SessionRecords(registry.database), clock=clock)  # another replica
    assert sessions2.authenticate(live.token) is None

    fresh = sessions.login(other)
    assert fresh is not None
    assert sessions.purge(older_than_s=0.5) == 2  # the two expired ones, not the live one
    clock.now += 10
    assert sessions2.authenticate(fresh.token) is not None


async def test_the_openapi_document_has_the_bisect_api_but_not_the_console_internals(console_env: ConsoleEnv) -> None:
    paths = (await console_env.client.get("/openapi.json")).json()["paths"]
    assert "/v1/snapshots/{snapshot_id}/bisect" in paths and "/v1/bisects/{bisect_id}" in paths
    assert not {"/ui/login", "/ui/logout", "/ui/session", "/ui/api/events", "/ui", "/ui/"} & set(paths)
