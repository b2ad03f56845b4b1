"""cryobox's TypeScript SDK (``sdk-ts/``) from the Python suite: compiling it and its tests with its pinned
TypeScript, and running them with node's test runner, its TAP summary read back (``# tests N`` / ``# pass`` /
``# fail``) so that a test asserts on the counts and shows node's whole report when something failed."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.node import NODE, SDK_TS, node_env

TSC = SDK_TS / "node_modules" / "typescript" / "bin" / "tsc"
TSCONFIG = SDK_TS / "tsconfig.json"


def tsc(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``tsc args…`` in ``sdk-ts/`` (the pinned compiler, run by the pinned node)."""
    return subprocess.run(
        [str(NODE), str(TSC), *args],
        cwd=SDK_TS,
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def compile_to(out: Path) -> Path:
    """The SDK and its tests compiled (strict) into ``out``: ``test/x.test.ts`` becomes ``out/test/x.test.js``."""
    done = tsc("-p", str(TSCONFIG), "--outDir", str(out))
    assert done.returncode == 0, f"tsc failed:\n{done.stdout}{done.stderr}"
    return out


@dataclass(frozen=True)
class NodeRun:
    returncode: int
    tests: int
    passed: int
    failed: int
    output: str

    def assert_passed(self, at_least: int) -> None:
        """Every test passed, and there were at least ``at_least`` (node's report in the message otherwise)."""
        ok = self.returncode == 0 and self.failed == 0 and self.passed == self.tests >= at_least
        assert ok, (
            f"node --test: {self.passed}/{self.tests} passed, {self.failed} failed (exit {self.returncode}); "
            f"its report:\n{self.output[-20000:]}"
        )


def _count(name: str, output: str) -> int:
    found = re.findall(rf"^# {name} (\d+)$", output, flags=re.MULTILINE)
    return int(found[-1]) if found else -1


def node_test(files: list[Path], *, env: dict[str, str] | None = None, timeout: float = 600) -> NodeRun:
    """``node --test`` of compiled test files (TAP report, tests in a file run in order)."""
    done = subprocess.run(
        [str(NODE), "--test", "--test-reporter=tap", *map(str, files)],
        cwd=SDK_TS,
        env=node_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    return NodeRun(done.returncode, _count("tests", output), _count("pass", output), _count("fail", output), output)
