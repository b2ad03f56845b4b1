"""Schema-driven fuzzing of the served OpenAPI document (schemathesis), bounded in examples and time.

Every response must be documented (status, content type, body schema) and none may be a server error: never a
500, and a 5xx only where the API contract says a caller may get one for a condition that is not cryobox's bug
(:data:`EXPECTED_5XX`: a guest that failed, a capacity refusal with ``Retry-After``, a command's own timeout).
Half of the sandbox-scoped cases target a real sandbox so the fuzzer reaches the guest, not only 404s, and half of
the deletes delete a throwaway object made for them (a sandbox, a snapshot, a volume).
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CheckContext
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from cryobox.errors import QuotaExceeded
from tests.support.serve import new_key

EXPECTED_5XX = {502: {"guest_error"}, 503: {"capacity", "store_throttled"}, 504: {"timeout"}}
"""The 5xx answers the contract (API.md, the 502 of routes/errors.py) gives for conditions that are not bugs."""


@schemathesis.check
def not_a_bug(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """No 500; a 5xx only as :data:`EXPECTED_5XX` (a 503 with its ``Retry-After``)."""
    status = response.status_code
    if status < 500:
        return None
    try:
        code = response.json().get("code")
    except ValueError:
        code = None
    assert code in EXPECTED_5XX.get(status, set()), f"server error {status} {code}: {response.text[:300]}"
    if status == 503:
        assert response.headers.get("retry-after"), "a capacity refusal without Retry-After"
    return None


CHECKS = [not_a_bug, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_key(server: ServeProcess) -> str:
    """The fuzzer's own workspace: the request budget (a per-workspace rate limit) it spends is not the one the
    tests running beside it on the shared server use."""
    return new_key(server.data_dir, "fuzzers")


@pytest.fixture(scope="module")
def fuzz_sandbox(server: ServeProcess, fuzz_key: str) -> Iterator[str]:
    sbx = Sandbox.create(template="base", api_url=server.url, api_key=fuzz_key)
    try:
        yield sbx.id
    finally:
        sbx.kill()
        # whatever the fuzzer created goes too
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {fuzz_key}"}) as http:
            for item in _unthrottled(http, "GET", "/v1/sandboxes").json()["items"]:
                _unthrottled(http, "DELETE", f"/v1/sandboxes/{item['id']}")
            for volume in _unthrottled(http, "GET", "/v1/volumes").json()["items"]:
                if volume["name"].startswith("fz"):  # the throwaways the fuzzer's deletes left
                    _unthrottled(http, "DELETE", f"/v1/volumes/{volume['name']}")


def _unthrottled(http: httpx.Client, method: str, path: str, json: Any = None) -> httpx.Response:
    """``method path``, waiting out the workspace's rate limit (a 429 the fuzzer's burst may still cause)."""
    deadline = time.monotonic() + 10
    while (response := http.request(method, path, json=json)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(float(response.headers.get("retry-after", "1")))
    return response


def _running(http: httpx.Client, sandbox: str) -> None:
    """Bring ``sandbox`` back to running: the fuzzer may have paused or hibernated it, as any caller may."""
    status = _unthrottled(http, "GET", f"/v1/sandboxes/{sandbox}").json().get("status")
    action = {"paused": "resume", "hibernated": "wake"}.get(str(status))
    if action is not None:
        response = _unthrottled(http, "POST", f"/v1/sandboxes/{sandbox}/{action}")
        assert response.status_code < 300, f"{action} of the fuzzed sandbox ({status}): {response.text[:300]}"


class Pace:
    """Keeps the fuzzer under its workspace's request rate, so its cases reach the routes, not the rate limit."""

    def __init__(self, per_s: float) -> None:
        self.interval = 1 / per_s
        self.next_at = time.monotonic()

    def wait(self) -> None:
        now = time.monotonic()
        if self.next_at > now:
            time.sleep(self.next_at - now)
        self.next_at = max(now, self.next_at) + self.interval


class Throwaways:
    """Real objects for DELETE cases to delete: a sandbox, a snapshot of the fuzz sandbox, an empty volume."""

    def __init__(self, server: ServeProcess, key: str, fuzz_sandbox: str) -> None:
        self.http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        self.fuzz_sandbox = fuzz_sandbox
        self.made = {"sandbox": 0, "snapshot": 0, "volume": 0}

    def _make(self, kind: str, path: str, body: dict[str, Any], key: str) -> str | None:
        response = _unthrottled(self.http, "POST", path, json=body)
        if response.status_code not in (200, 201):  # a quota or capacity the fuzzer used up: leave the case as it is
            return None
        self.made[kind] += 1
        return str(response.json()[key])

    def aim(self, case: Any) -> None:
        params = case.path_parameters
        if case.path == "/v1/sandboxes/{sandbox_id}":
            made = self._make("sandbox", "/v1/sandboxes", {"template": "base"}, "id")
            target = "sandbox_id"
        elif case.path == "/v1/snapshots/{snapshot_id}":
            _running(self.http, self.fuzz_sandbox)
            made = self._make("snapshot", f"/v1/sandboxes/{self.fuzz_sandbox}/snapshots", {}, "id")
            target = "snapshot_id"
        elif case.path.startswith("/v1/volumes/{name}"):
            name = f"fz{secrets.token_hex(4)}"
            made = self._make("volume", "/v1/volumes", {"name": name, "size_mb": 64}, "name")
            target = "name"
        else:
            return
        if made is not None:
            params[target] = made


def test_no_5xx_and_responses_match_the_document(
    server: ServeProcess, fuzz_key: str, fuzz_sandbox: str, request: pytest.FixtureRequest
) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {fuzz_key}"}
    rng = random.Random(7)
    calls = 0
    statuses: dict[int, int] = {}

    throwaways = Throwaways(server, fuzz_key, fuzz_sandbox)
    request.addfinalizer(throwaways.http.close)
    pace = Pace(per_s=40)  # the server's default limit is 50 per second, with a burst of 100

    def run(case: Any) -> None:
        nonlocal calls
        params = case.path_parameters or {}
        if case.method == "DELETE" and rng.random() < 0.5:
            throwaways.aim(case)
        elif "sandbox_id" in params and rng.random() < 0.5:
            if not (case.method == "DELETE" and case.path == "/v1/sandboxes/{sandbox_id}"):
                params["sandbox_id"] = fuzz_sandbox
        if isinstance(case.body, dict):
            # keep the run bounded: fuzzed commands may be long-running programs
            case.body["timeout_seconds"] = 2
            if case.method == "POST" and case.path == "/v1/sandboxes":
                case.body["template"] = "base"
        calls += 1
        deadline = time.monotonic() + 10
        while True:  # a 429 is checked against the document too, then the case is sent again once allowed
            pace.wait()
            response = case.call_and_validate(base_url=server.url, headers=headers, checks=CHECKS)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code != 429 or time.monotonic() > deadline:
                break
            time.sleep(min(float(response.headers.get("retry-after", "1")), 2.0))

    operations = [cast(Any, result).ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14
    for operation in operations:
        test = settings(
            max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
        )(given(case=operation.as_strategy())(run))
        test()
    assert calls >= len(operations)
    print(f"\nfuzzed {calls} requests over {len(operations)} operations; statuses {dict(sorted(statuses.items()))}")
    assert any(200 <= code < 300 for code in statuses), "the fuzzer must reach working paths, not only errors"
    assert throwaways.made["sandbox"] and throwaways.made["snapshot"] and throwaways.made["volume"], throwaways.made
    # the fuzzed sandbox still works: it may have been paused or hibernated by a case, as by any caller; the
    # fuzzer may have spent its workspace's request budget (429 is what it should get then): wait it out, for the
    # connect as for the command
    _running(throwaways.http, fuzz_sandbox)
    deadline = time.monotonic() + 10
    while True:
        survivor = None
        try:
            survivor = Sandbox.connect(fuzz_sandbox, api_url=server.url, api_key=fuzz_key)
            assert survivor.exec("true").exit_code == 0
            break
        except QuotaExceeded:
            assert time.monotonic() < deadline, "the rate limit never let the survivor through"
            time.sleep(0.5)
        finally:
            if survivor is not None:
                survivor.close()
