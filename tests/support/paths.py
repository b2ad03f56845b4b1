"""Paths the tests name: the repository, the tests and the integration suite's guest-side applications."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
APPS = TESTS / "integration" / "apps"
"""The applications the integration tests run unchanged against ``cryobox serve`` (E2B's and PandaStack's SDKs,
a WebSocket echo server)."""
