"""HTTP plumbing shared by the SDK classes: configuration, error mapping (the one translation boundary)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import ERRORS_BY_CODE, CryoboxError, HostUnavailable

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    api_key: str
    timeout_s: float = 300.0

    @classmethod
    def resolve(cls, api_url: str | None = None, api_key: str | None = None, timeout_s: float = 300.0) -> ClientConfig:
        url = api_url or os.environ.get("CRYOBOX_API_URL") or DEFAULT_URL
        key = api_key or os.environ.get("CRYOBOX_API_KEY") or ""
        return cls(api_url=url.rstrip("/"), api_key=key, timeout_s=timeout_s)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {self.api_key}", "User-Agent": "cryobox-python"},
            timeout=httpx.Timeout(self.timeout_s, connect=10.0),
        )


def raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    message = str(body.get("error") or f"HTTP {response.status_code}")
    code = str(body.get("code") or "")
    details = body.get("details") if isinstance(body.get("details"), dict) else {}
    cls = ERRORS_BY_CODE.get(code) or _by_status(response.status_code)
    if cls is HostUnavailable:
        retry = float(response.headers.get("retry-after", "1") or 1)
        raise HostUnavailable(message, retry_after_s=retry, details=details)
    raise cls(message, details=details)


_BY_STATUS: dict[int, type[CryoboxError]] = {
    cls.http_status: cls for cls in ERRORS_BY_CODE.values() if cls.http_status not in (200, 500)
}


def _by_status(status: int) -> type[CryoboxError]:
    """For bodies without a known code (a proxy's page, say): only unambiguous statuses map to a subclass."""
    return _BY_STATUS.get(status, CryoboxError)
