"""``AsyncFilesystem``: files inside a sandbox's guest (``sbx.filesystem``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from ... import models
from ...errors import NotFound
from .. import _base, _procs, _requests
from ._http import stream_lines

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

    async def signed_url(
        self,
        path: str,
        operation: models.FileOperation = "read",
        *,
        expires_in: int | None = None,
        user: str | None = None,
    ) -> models.FileUrl:
        """A URL that reads (``read``: ``GET`` it) or writes (``write``: ``PUT`` the raw bytes) the file at ``path``
        with no API key, e.g. with ``curl``, until ``expires_at`` (``expires_in`` seconds; the server's default is
        an hour, 7 days at most). ``user``: who a write's file belongs to.

        :raises NotFound: no such sandbox. :raises InvalidArgument: a relative path, ``user`` on a read.
        """
        request = _requests.file_url_request(self._sbx.id, path, operation, expires_in=expires_in, user=user)
        return _base.parse_model(models.FileUrl, await self._sbx._send(request))

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

    async def watch(self, path: str, *, recursive: bool = False) -> AsyncGenerator[_procs.FsWatchEvent]:
        """Yield changes under the directory ``path``: first a ``start`` event once the watch is in place (make
        changes after it), then ``create`` / ``write`` / ``remove`` / ``rename`` / ``chmod`` events naming the
        entry relative to ``path`` (subdirectories too with ``recursive``). The watch runs until the iterator is
        closed (``contextlib.aclosing``), which ends it in the guest.

        :raises NotFound: no such directory.
        """
        request = _procs.watch_request(
            self._sbx.id, path, recursive=recursive, client_timeout_s=self._sbx._config.timeout_s
        )
        decoder = _procs.WatchStreamDecoder()
        async with contextlib.aclosing(stream_lines(self._sbx._http, request)) as lines:
            async for line in lines:
                event = decoder.feed(line)
                if event is not None:
                    yield event
        raise _procs.watch_ended()
