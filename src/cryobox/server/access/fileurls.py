"""Signed file URLs of cryobox's own API: ``POST /v1/sandboxes/{id}/files/url`` hands out a URL that reads (``GET``)
or writes (``PUT``, the raw body) one guest file with no API key, until it expires.

The URL is ``/v1/sandboxes/{id}/files/signed?path=&[user=&]expires=&signature=``: the signature is an HMAC
(:meth:`~cryobox.util.sealing.Sealer.mac`, under a key derived from the registry's sealing key for this purpose)
of the sandbox id, the operation, the path, the user and the expiry, so it opens that one file of that one sandbox
for that one operation: every control-plane replica sharing the key checks it, nothing is stored, and a rotated
key keeps URLs valid while the old key is still listed. A URL always expires (at most :data:`MAX_TTL_S` out).

A tampered or expired URL is refused (401) before the registry, the guest or the request body is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ...errors import InvalidArgument, Unauthorized
from ...util.sealing import Sealer

PURPOSE = "v1-file-url"
Operation = Literal["read", "write"]
METHODS: dict[Operation, Literal["GET", "PUT"]] = {"read": "GET", "write": "PUT"}
DEFAULT_TTL_S = 3600
MAX_TTL_S = 7 * 24 * 3600
PARAMS = frozenset({"path", "user", "expires", "signature"})
"""The signed route's query parameters: any other is a 400 naming it."""


@dataclass(frozen=True)
class FileGrant:
    """What one URL allows: ``operation`` on ``path`` in ``sandbox_id`` (a write owned by ``user``) until
    ``expires`` (Unix seconds)."""

    sandbox_id: str
    operation: Operation
    path: str
    expires: int
    user: str | None = None

    def message(self) -> str:
        fields = ["cryobox-file-url/1", self.sandbox_id, self.operation, self.path, self.user or "", self.expires]
        return json.dumps(fields, separators=(",", ":"))

    def query(self, sealer: Sealer) -> dict[str, str]:
        """The URL's query parameters, signature included."""
        query = {"path": self.path}
        if self.user is not None:
            query["user"] = self.user
        query["expires"] = str(self.expires)
        query["signature"] = sealer.mac(PURPOSE, self.message())
        return query


def grant_of(sandbox_id: str, operation: Operation, query: Mapping[str, str]) -> tuple[FileGrant, str]:
    """The grant a signed request claims (its method says the operation) and the signature it shows.

    :raises InvalidArgument: an unknown or missing parameter, a malformed expiry.
    """
    unknown = sorted(set(query) - PARAMS)
    if unknown:
        raise InvalidArgument(f"unknown query parameter(s): {', '.join(unknown)}", details={"fields": unknown})
    missing = sorted({"path", "expires", "signature"} - set(query))
    if missing:
        raise InvalidArgument(f"missing query parameter(s): {', '.join(missing)}", details={"fields": missing})
    raw = query["expires"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise InvalidArgument("expires must be Unix seconds", details={"field": "expires"})
    grant = FileGrant(sandbox_id, operation, query["path"], int(raw), query.get("user"))
    return grant, query["signature"]


def check(sealer: Sealer, grant: FileGrant, signature: str, now: float) -> None:
    """Accept ``signature`` for ``grant`` at ``now``. :raises Unauthorized: not signed here for exactly this
    grant (another sandbox, operation, path, user or expiry), or expired (the expiry second is the last good one)."""
    if not sealer.verify_mac(PURPOSE, grant.message(), signature):
        raise Unauthorized("invalid file URL signature")
    if grant.expires < math.floor(now):
        raise Unauthorized("the file URL has expired")
