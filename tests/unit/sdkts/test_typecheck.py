"""``tsc --noEmit`` of the TypeScript SDK and its tests, strict (``sdk-ts/tsconfig.json``): what ``make lint`` runs."""

from __future__ import annotations

from tests.support.sdkts import TSCONFIG, tsc


def test_the_sdk_type_checks_strict() -> None:
    done = tsc("--noEmit", "-p", str(TSCONFIG))
    assert done.returncode == 0, f"tsc --noEmit found errors:\n{done.stdout}{done.stderr}"
