"""Unit tests: a per-test timeout for those that do not set their own."""

from __future__ import annotations

from pathlib import Path

import pytest

TIMEOUT_S = 120  # per test (setup, call and teardown), unless it has its own @pytest.mark.timeout
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the hook sees every collected item of the session, not only this directory's
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S))
