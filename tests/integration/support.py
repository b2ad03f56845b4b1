"""Types shared by the integration tests."""

from __future__ import annotations

from typing import TypedDict


class Api(TypedDict):
    """Keyword arguments that point SDK calls at the test server."""

    api_url: str
    api_key: str
