"""Crash suite: real ``cryobox serve`` processes SIGKILLed at named steps (``CRYOBOX_CRASH_FILE``), restarted,
and checked; bounded by a per-test timeout like the rest of the suite."""

from __future__ import annotations

import pytest

from tests.support.host import cache_dir, host_paths, templates

__all__ = ["cache_dir", "host_paths", "templates"]  # the session fixtures, bound here (tests/support/host.py)
TIMEOUT_S = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos" in str(item.path):
            item.add_marker(pytest.mark.vm)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TIMEOUT_S))
