"""``AsyncFilesystem``: files inside a sandbox's guest (``sbx.filesystem``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import models
from ...errors import NotFound
from .. import _base, _requests

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox


class AsyncFilesystem:
    """Files inside the sandbox's guest (``sbx.filesystem``); paths are guest paths."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    async def read(self, path: str) -> bytes:
        """:raises NotFound: no such file."""
        response = await self._sbx._send(_requests.fs_request(self._sbx.id, "GET", path))
        return response.content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        data = await self.read(path)
        return data.decode(encoding)

    async def write(self, path: str, data: str | bytes) -> int:
        """Write ``data`` (``str`` is UTF-8 encoded), creating parent directories; returns the bytes written.

        :raises PayloadTooLarge: more than the server accepts (64 MiB).
        """
        payload = data.encode() if isinstance(data, str) else data
        response = await self._sbx._send(_requests.fs_request(self._sbx.id, "PUT", path, content=payload))
        return _base.parse_write(response)

    async def list(self, path: str) -> list[models.FileEntry]:
        response = await self._sbx._send(_requests.fs_request(self._sbx.id, "GET", path, suffix="/dir"))
        return _base.parse_dir(response)

    async def stat(self, path: str) -> models.FileEntry:
        response = await self._sbx._send(_requests.fs_request(self._sbx.id, "GET", path, suffix="/stat"))
        return _base.parse_entry(response)

    async def exists(self, path: str) -> bool:
        """``False`` only when the path does not exist; any other failure is raised."""
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def remove(self, path: str) -> None:
        await self._sbx._send(_requests.fs_request(self._sbx.id, "DELETE", path))
