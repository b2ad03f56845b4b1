"""cryobox's TypeScript SDK against the suite's real server: ``sdk-ts/test/integration`` (create → exec → streamed
exec and its cancellation → background processes → files → terminal → runCode → snapshot → restore → fork_tree →
errors → retries through a refusing proxy → kill, on few sandboxes, all killed), compiled strict and run by node's
test runner with ``CRYOBOX_API_URL`` / ``CRYOBOX_API_KEY``; node's report shows in the failure."""

from __future__ import annotations

from pathlib import Path

from cryobox.bench.server import ServeProcess
from tests.support.sdkts import compile_to, node_test

NODE_TESTS = 13
"""The integration file's test count (a test that silently vanished fails this too)."""


def test_the_typescript_sdk_against_a_real_server(server: ServeProcess, tmp_path: Path) -> None:
    build = compile_to(tmp_path / "build")
    files = sorted((build / "test" / "integration").glob("*.test.js"))
    run = node_test(files, env={"CRYOBOX_API_URL": server.url, "CRYOBOX_API_KEY": server.api_key}, timeout=900)
    print(f"node --test: {run.passed}/{run.tests} passed")
    run.assert_passed(at_least=NODE_TESTS)
