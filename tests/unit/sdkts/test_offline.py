"""The TypeScript SDK's offline tests (``sdk-ts/test/offline``: error classes, retries on a fake clock, SSE
decoding split anywhere, cancellation, against a scripted server on loopback), compiled strict and run by node's
test runner; and its error classes checked against the API's error tree (``cryobox.errors``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cryobox.errors import ERRORS_BY_CODE, CryoboxError
from tests.support.node import NODE, node_env
from tests.support.sdkts import compile_to, node_test


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_to(tmp_path_factory.mktemp("sdkts-build"))


def test_the_offline_tests_pass(build: Path) -> None:
    run = node_test(sorted((build / "test" / "offline").glob("*.test.js")), timeout=120)
    run.assert_passed(at_least=28)


def test_the_error_classes_are_the_apis_codes_and_statuses(build: Path) -> None:
    errors = (build / "src" / "errors.js").as_uri()
    script = (
        f"const {{ ERRORS_BY_CODE }} = await import({json.dumps(errors)});"
        "console.log(JSON.stringify(Object.fromEntries([...ERRORS_BY_CODE].map(([c, cls]) => [c, cls.httpStatus]))));"
    )
    done = subprocess.run(
        [str(NODE), "--input-type=module", "-e", script],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    in_ts = json.loads(done.stdout)
    # every code of the API's table, and every other class of the tree the server sends (e.g. port_unreachable)
    tree = [cls for cls in _subclasses(CryoboxError) if cls.__module__ == CryoboxError.__module__]
    sent = {cls.code: cls.http_status for cls in tree if cls.http_status != 200}
    assert set(ERRORS_BY_CODE) <= set(in_ts)
    assert in_ts == sent


def _subclasses(cls: type[CryoboxError]) -> list[type[CryoboxError]]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _subclasses(child))]
