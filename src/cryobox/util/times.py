"""Times on the wire: epoch seconds rendered as RFC 3339 (UTC, ``Z``), the one format every front door answers with."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(epoch_s: float) -> str:
    """``1700000000.5`` -> ``"2023-11-14T22:13:20.500000Z"``."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")
