"""Signed upload URLs for E2B's template files: the SDK PUTs a build context to the URL ``GET
/templates/{id}/files/{hash}`` returned, with no API key, so the URL carries its own authorization.

The token is ``<payload>.<tag>``: the payload (url-safe base64 of ``workspace|template|files hash|expiry``) and an
HMAC of it under the registry's key (:meth:`~cryobox.util.sealing.Sealer.mac`, the key every replica shares; a
data dir without ``CRYOBOX_SECRET_KEY`` generates one at start). Nothing is stored; a tampered or expired token is
refused (401) before the body is read.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from ...errors import Unauthorized
from ...util.sealing import Sealer

PURPOSE = "e2b-template-upload"
TTL_S = 3600.0
PATH = "/e2b/template-uploads/"
"""Where upload URLs point (the API gate lets these through without a key: the route checks the token)."""


@dataclass(frozen=True)
class UploadGrant:
    workspace_id: str
    template: str
    files_hash: str
    expires_at: float


def sign(sealer: Sealer, grant: UploadGrant) -> str:
    message = f"{grant.workspace_id}|{grant.template}|{grant.files_hash}|{int(grant.expires_at)}"
    payload = base64.urlsafe_b64encode(message.encode()).decode().rstrip("=")
    return f"{payload}.{sealer.mac(PURPOSE, payload)}"


def verify(sealer: Sealer, token: str, now: float) -> UploadGrant:
    """The grant ``token`` carries; ``Unauthorized`` if it was not signed here or has expired."""
    payload, _, tag = token.partition(".")
    if not payload or not tag or not sealer.verify_mac(PURPOSE, payload, tag):
        raise Unauthorized("invalid upload token")
    try:
        message = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
        workspace_id, template, files_hash, expiry = message.split("|")
        grant = UploadGrant(workspace_id, template, files_hash, float(int(expiry)))
    except (ValueError, binascii.Error, UnicodeDecodeError) as err:
        raise Unauthorized("invalid upload token") from err
    if grant.expires_at < now:
        raise Unauthorized("the upload URL has expired")
    return grant
