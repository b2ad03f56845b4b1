"""Signed file URLs of E2B's SDK (``Sandbox.download_url`` / ``upload_url``), checked byte for byte as envd checks
them, so a URL the unmodified SDK builds downloads or uploads with a plain HTTP client and no key or token.

What the SDK signs (``e2b`` 2.63, ``e2b/sandbox/signature.py`` ``get_signature``; the JS SDK's ``getSignature``)
and envd verifies (e2b-dev/infra ``packages/envd/internal/api/auth.go``: ``generateSignature`` and
``validateSigning``, called first by ``GetFiles``/``PostFiles`` in ``download.go``/``upload.go``)::

    "v1_" + base64(sha256("<path>:<operation>:<username>:<access token>[:<expiration>]"))

- base64 is the standard alphabet without padding (Go's ``RawStdEncoding``; the SDK strips the ``=``);
- ``path`` is the ``path`` query parameter as sent, unresolved ("" without one), ``operation`` is ``read`` for
  ``GET /files`` and ``write`` for ``POST /files``, ``username`` the ``username`` parameter ("" without one: the
  default user), the access token the sandbox's ``envdAccessToken``;
- ``:<expiration>`` is there only when the request has ``signature_expiration`` (Unix seconds, decimal); the URL is
  refused once that second is in the past (``expiration < now``, envd compares with ``time.Now().Unix()``), so it
  still works during its last second;
- a request that carries ``X-Access-Token`` is judged by that header alone: a wrong token is refused even with a
  good signature (envd checks the header first and never looks at the signature then);
- without the header, no ``signature`` is a 401 (cryobox's envd always has an access token: ``secure: false`` is
  refused at create, so envd's "no token, no check" case never arises).

A ``signature_expiration`` that is not a 64-bit integer is a 400 (envd's generated parameter binding refuses it
before the handler runs). Every refusal happens before the registry or the guest is touched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ...errors import InvalidArgument, Unauthorized

Operation = Literal["read", "write"]
READ: Operation = "read"
WRITE: Operation = "write"
PREFIX = "v1_"
SIGNATURE_PARAM = "signature"
EXPIRATION_PARAM = "signature_expiration"
_INT64 = re.compile(r"^[+-]?[0-9]{1,19}$")
_INT64_MAX = (1 << 63) - 1


def sign(path: str, operation: Operation, username: str, token: str, expiration: int | None = None) -> str:
    """The signature of a file URL, as the SDK makes it (see the module docstring)."""
    fields = [path, operation, username, token]
    if expiration is not None:
        fields.append(str(expiration))
    digest = hashlib.sha256(":".join(fields).encode("utf-8")).digest()
    return PREFIX + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def parse_expiration(raw: str) -> int:
    """``signature_expiration`` as envd binds it (a Go ``int``); a 400 naming the parameter otherwise."""
    value = int(raw) if _INT64.match(raw) else None
    if value is None or not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise InvalidArgument(
            f"Invalid format for parameter {EXPIRATION_PARAM}: {raw[:32]!r} is not an integer",
            details={"parameter": EXPIRATION_PARAM},
        )
    return value


@dataclass(frozen=True)
class FileSignature:
    """What one ``/files`` request claims with its query: the signed fields and the signature."""

    path: str
    operation: Operation
    username: str
    signature: str
    expiration: int | None = None

    def expected(self, token: str) -> str:
        return sign(self.path, self.operation, self.username, token, self.expiration)


def from_query(query: Mapping[str, str], operation: Operation) -> FileSignature | None:
    """The request's signature claim (``None`` without a ``signature`` parameter); ``query`` holds the first value
    of each parameter, decoded. :raises InvalidArgument: a malformed ``signature_expiration``."""
    raw_expiration = query.get(EXPIRATION_PARAM)
    expiration = parse_expiration(raw_expiration) if raw_expiration is not None else None
    signature = query.get(SIGNATURE_PARAM)
    if signature is None:
        return None
    return FileSignature(
        path=query.get("path", ""),
        operation=operation,
        username=query.get("username", ""),
        signature=signature,
        expiration=expiration,
    )


def check(claim: FileSignature, tokens: Iterable[str], now: float) -> None:
    """Accept ``claim`` when it is the signature under one of ``tokens`` (the sandbox's access token under each
    listed key) and has not expired at ``now`` (Unix seconds).

    :raises Unauthorized: a wrong signature (another path, operation, user, expiration or sandbox) or an expired one.
    """
    given = claim.signature.encode("utf-8", "replace")
    matched = False
    for token in tokens:  # every one, constant time each: how many keys there are is all the timing tells
        matched |= hmac.compare_digest(claim.expected(token).encode("ascii"), given)
    if not matched:
        raise Unauthorized("invalid signature")
    if claim.expiration is not None and claim.expiration < math.floor(now):
        raise Unauthorized("signature is already expired")
