"""Failure capture: run tests in a sandbox and keep the machine of a failing or hung run as a snapshot.

``cryobox capture`` (``runner.CaptureRunner``) is the command; this package is also a pytest plugin:
``pytest -p cryobox.capture --cryobox-template T`` (the hooks live in ``plugin`` and are re-exported here so that
pytest finds them on this module).
"""

from __future__ import annotations

from .plugin import pytest_addoption, pytest_cmdline_main

__all__ = ["pytest_addoption", "pytest_cmdline_main"]
