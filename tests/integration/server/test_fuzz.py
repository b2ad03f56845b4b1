"""Schema-driven fuzzing of the served OpenAPI document (schemathesis), bounded in examples and time.

Every response must be documented (status, content type, body schema) and none may be a 5xx. Half of the
sandbox-scoped cases target a real sandbox so the fuzzer reaches the guest, not only 404s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from cryobox.errors import QuotaExceeded

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_sandbox(server: ServeProcess) -> Iterator[str]:
    sbx = Sandbox.create(template="base", api_url=server.url, api_key=server.api_key)
    try:
        yield sbx.id
    finally:
        sbx.kill()
        # whatever the fuzzer created goes too
        headers = {"Authorization": f"Bearer {server.api_key}"}
        for item in httpx.get(f"{server.url}/v1/sandboxes", headers=headers).json()["items"]:
            httpx.delete(f"{server.url}/v1/sandboxes/{item['id']}", headers=headers)


def test_no_5xx_and_responses_match_the_document(server: ServeProcess, fuzz_sandbox: str) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {server.api_key}"}
    rng = random.Random(7)
    calls = 0
    statuses: dict[int, int] = {}

    def run(case: Any) -> None:
        nonlocal calls
        if "sandbox_id" in (case.path_parameters or {}) and rng.random() < 0.5:
            if not (case.method == "DELETE" and case.path == "/v1/sandboxes/{sandbox_id}"):
                case.path_parameters["sandbox_id"] = fuzz_sandbox
        if isinstance(case.body, dict):
            # keep the run bounded: fuzzed commands may be long-running programs
            case.body["timeout_seconds"] = 2
            if case.method == "POST" and case.path == "/v1/sandboxes":
                case.body["template"] = "base"
        calls += 1
        response = case.call_and_validate(base_url=server.url, headers=headers, checks=CHECKS)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

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
    survivor = Sandbox.connect(fuzz_sandbox, api_url=server.url, api_key=server.api_key)
    try:
        # the fuzzer may have spent the key's request budget (429 is what it should get then): wait it out
        deadline = time.monotonic() + 10
        while True:
            try:
                assert survivor.exec("true").exit_code == 0
                break
            except QuotaExceeded:
                assert time.monotonic() < deadline, "the rate limit never let the survivor through"
                time.sleep(0.5)
    finally:
        survivor.close()
