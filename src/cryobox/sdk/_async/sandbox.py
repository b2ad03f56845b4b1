"""``AsyncSandbox``: the asynchronous SDK object for one sandbox.

The SDK's IO is written once, asynchronously, in ``sdk/_async``; ``scripts/unasync.py`` generates ``sdk/_sync``
from it. Wire logic (request building, parsing, error mapping, retry planning) lives in ``sdk/_base``.

Example::

    from cryobox import AsyncSandbox

    async with await AsyncSandbox.create(template="base") as sbx:
        await sbx.filesystem.write("/work/task.py", "print(6 * 7)")
        result = await sbx.exec("python3 /work/task.py")
        print(result.stdout)   # "42\\n"
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import httpx

from ... import models
from ...errors import CryoboxError, NotFound
from .. import _base, _requests, _sse
from .._base import DEFAULT_RETRY, ClientConfig, ExecResult, Lifecycle, RetryPolicy, StreamEvent
from .._sse import OutputCallback
from ._http import send


def _open(config: ClientConfig) -> httpx.AsyncClient:
    return httpx.AsyncClient(**config.client_options())


async def _lines_then_end(response: httpx.Response) -> AsyncIterator[str]:
    """The response's lines, then one ``""`` that flushes an event whose final blank line never came."""
    async for line in response.aiter_lines():  # noqa: UP028 (in the generated sync twin, `yield from` would do)
        yield line
    yield ""


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


class AsyncSandbox:
    """One sandbox. Build it with ``create`` or ``connect``; ``async with`` kills it on exit.

    The object owns its HTTP client: ``aclose()`` releases it and leaves the sandbox running, ``kill()`` deletes
    the sandbox and releases it.
    """

    def __init__(
        self,
        info: models.Sandbox,
        config: ClientConfig,
        http: httpx.AsyncClient | None = None,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.info = info
        self._config = config
        self._http = http if http is not None else _open(config)
        self._retry = retry
        self.filesystem = AsyncFilesystem(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, template={self.info.template!r}, status={self.info.status!r})"

    async def _send(self, request: _requests.ApiRequest) -> httpx.Response:
        return await send(self._http, request, self._retry)

    # --- construction --------------------------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        template: str = "code-interpreter",
        *,
        ttl_seconds: int | None = None,
        persistent: bool = False,
        metadata: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        network: models.NetworkSpec | Mapping[str, Any] | None = None,
        from_snapshot: str | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http: httpx.AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox (a snapshot restore of ``template``, or of ``from_snapshot``).

        Capacity refusals (503 / 429 with ``Retry-After``) are retried with jitter within ``retry.budget_s``.
        ``api_url`` / ``api_key`` default to ``$CRYOBOX_API_URL`` / ``$CRYOBOX_API_KEY``. ``http`` is an optional
        client to use (custom transport, tests); the returned sandbox takes ownership of it.

        :raises HostUnavailable: no capacity within the retry budget (``retry_after_s`` says when to try again).
        :raises QuotaExceeded: rate limited beyond the retry budget.
        :raises NotFound: unknown template or snapshot.
        """
        request = _requests.create_request(
            template,
            ttl_seconds=ttl_seconds,
            persistent=persistent,
            metadata=metadata,
            env=env,
            network=network,
            from_snapshot=from_snapshot,
        )
        return await cls._attach(ClientConfig.resolve(api_url, api_key, timeout_s), http, request, retry)

    @classmethod
    async def _attach(
        cls, config: ClientConfig, http: httpx.AsyncClient | None, request: _requests.ApiRequest, retry: RetryPolicy
    ) -> AsyncSandbox:
        """Send a request answered by a Sandbox and wrap it; a client opened here is closed if that fails."""
        client = http if http is not None else _open(config)
        try:
            info = _base.parse_sandbox(await send(client, request, retry))
        except BaseException:
            if http is None:
                await client.aclose()
            raise
        return cls(info, config, client, retry=retry)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http: httpx.AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Attach to an existing sandbox.

        :raises NotFound: no such sandbox (or it belongs to another workspace).
        """
        config = ClientConfig.resolve(api_url, api_key, timeout_s)
        return await cls._attach(config, http, _requests.get_request(sandbox_id), retry)

    @classmethod
    async def list(
        cls,
        *,
        status: str | None = None,
        metadata: Mapping[str, str] | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> list[models.Sandbox]:
        """The workspace's sandboxes, optionally only those in ``status`` whose metadata contains ``metadata``.

        A given ``http`` client is left open.
        """
        config = ClientConfig.resolve(api_url, api_key, timeout_s)
        client = http if http is not None else _open(config)
        try:
            response = await send(client, _requests.list_request(status=status, metadata=metadata), DEFAULT_RETRY)
            return _base.parse_sandbox_list(response)
        finally:
            if http is None:
                await client.aclose()

    # --- state and lifecycle -------------------------------------------------------------------------------------

    async def refresh(self) -> models.Sandbox:
        """Re-read the sandbox from the API into ``info``."""
        self.info = _base.parse_sandbox(await self._send(_requests.get_request(self.id)))
        return self.info

    async def lifecycle(self) -> Lifecycle:
        return _base.parse_lifecycle(await self._send(_requests.lifecycle_request(self.id)))

    async def set_ttl(self, seconds: int) -> Lifecycle:
        """Reset the time to live to ``seconds`` from now.

        :raises InvalidArgument: ``seconds`` is out of range.
        """
        return await self._update_lifecycle(_requests.update_lifecycle_request(self.id, ttl_seconds=seconds))

    async def set_persistent(self, persistent: bool) -> Lifecycle:
        """A persistent sandbox is hibernated instead of deleted when it expires."""
        return await self._update_lifecycle(_requests.update_lifecycle_request(self.id, persistent=persistent))

    async def _update_lifecycle(self, request: _requests.ApiRequest) -> Lifecycle:
        lifecycle = _base.parse_lifecycle(await self._send(request))
        self.info = self.info.model_copy(
            update={"persistent": lifecycle.persistent, "expires_at": lifecycle.expires_at}
        )
        return lifecycle

    # --- commands ------------------------------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Run ``cmd`` with ``/bin/sh -c`` in the sandbox and wait for it.

        :raises SandboxTimeout: the command ran past ``timeout_seconds`` (its process group was killed).
        :raises CommandFailed: ``check`` is set and the exit code is not 0.
        """
        request = _requests.exec_request(
            self.id,
            cmd,
            timeout_seconds=timeout_seconds,
            env=env,
            cwd=cwd,
            stdin=stdin,
            client_timeout_s=self._config.timeout_s,
        )
        return _base.parse_exec(await self._send(request), cmd=cmd, check=check)

    async def exec_stream(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> AsyncGenerator[StreamEvent]:
        """Yield ``stdout`` / ``stderr`` events as the command produces output, then exactly one ``exit`` event.

        ``on_stdout`` / ``on_stderr``, when given, are also called with each chunk. Stop early by closing the
        iterator (``contextlib.aclosing``); the HTTP stream is released when it closes.

        :raises SandboxTimeout: the command ran past ``timeout_seconds``.
        :raises GuestError: the stream ended without an exit code.
        :raises CryoboxError: any other ``error`` event, mapped by its code.
        """
        request = _requests.exec_request(
            self.id,
            cmd,
            timeout_seconds=timeout_seconds,
            env=env,
            cwd=cwd,
            stdin=stdin,
            client_timeout_s=self._config.timeout_s,
            stream=True,
        )
        decoder = _sse.ExecStreamDecoder()
        try:
            async with self._http.stream(request.method, request.path, **request.send_options()) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _base.raise_for_error(response)
                async for line in _lines_then_end(response):
                    event = decoder.feed(line)
                    if event is None:
                        continue
                    _sse.notify(event, on_stdout, on_stderr)
                    yield event
                    if event.kind == "exit":
                        return
        except httpx.TransportError as err:
            raise _base.transport_error(err, str(self._http.base_url)) from err
        raise _sse.stream_ended_early()

    # --- teardown ------------------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release this object's HTTP connections; the sandbox keeps running."""
        await self._http.aclose()

    async def kill(self, *, keep_snapshots: bool = False) -> None:
        """Delete the sandbox (and its non-retained snapshots unless ``keep_snapshots``), then ``aclose()``.

        Killing an already-deleted sandbox is not an error.
        """
        try:
            await self._send(_requests.kill_request(self.id, keep_snapshots=keep_snapshots))
        except NotFound:
            pass
        finally:
            await self.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.kill()
            return
        try:
            await self.kill()
        except CryoboxError as kill_error:  # do not hide the exception that is already propagating
            exc.add_note(f"cryobox: killing sandbox {self.id} also failed: {kill_error!r}")
