"""What every workspace-level client of the SDK (``AsyncSnapshots``, ``AsyncTemplates``) is: one API endpoint and
key (arguments, else ``$CRYOBOX_API_URL`` / ``$CRYOBOX_API_KEY``), one owned HTTP client, released by ``aclose()``
or ``async with``."""

from __future__ import annotations

from types import TracebackType
from typing import Self

import httpx

from .._base import DEFAULT_RETRY, ClientConfig
from .._requests import ApiRequest
from ._http import open_client, send


class AsyncApiClient:
    """``http`` is an optional client to use (custom transport, tests); this object takes ownership of it."""

    def __init__(
        self,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._config = ClientConfig.resolve(api_url, api_key, timeout_s)
        self._http = http if http is not None else open_client(self._config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._config.api_url!r})"

    async def _send(self, request: ApiRequest) -> httpx.Response:
        return await send(self._http, request, DEFAULT_RETRY)

    async def aclose(self) -> None:
        """Release the HTTP connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


__all__ = ["AsyncApiClient"]
