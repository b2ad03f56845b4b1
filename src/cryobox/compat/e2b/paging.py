"""E2B's list paging: ``limit`` and ``nextToken`` in, ``X-Next-Token`` out. A token is an opaque offset into the
list as the route orders it (``o:<n>``, base64url); one this server did not issue is a 400 naming ``nextToken``."""

from __future__ import annotations

import base64
import binascii

from ...errors import InvalidArgument


def page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode().rstrip("=")


def page_offset(token: str | None) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        if not text.startswith("o:"):
            raise ValueError(text)
        return max(0, int(text[2:]))
    except (ValueError, binascii.Error, UnicodeDecodeError) as err:
        raise InvalidArgument("nextToken is not a token this server issued", details={"field": "nextToken"}) from err


__all__ = ["page_offset", "page_token"]
