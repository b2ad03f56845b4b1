"""``AsyncProcesses`` (``sbx.processes``) and ``AsyncProcess``: background processes in a sandbox's guest.

A process started here runs until it exits or is signalled, whatever happens to the objects and streams that
follow it: ``stream()`` and ``wait()`` replay what it printed so far (from the guest's bounded buffer), then
follow it live; stopping either only detaches. Example::

    server = await sbx.processes.start("python3 -m http.server 8000", tag="web")
    async for event in server.stream():  # what it printed so far, then live output
        if "Serving HTTP" in event.chunk:
            break  # detaches: the server keeps running
    job = await sbx.exec("sort", background=True, stdin="b\\na\\n")
    result = await job.wait(timeout_seconds=30)
    print(result.exit_code, result.stdout)  # 0 "a\\nb\\n"
    await server.kill()
"""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING

from ... import models
from ...errors import CryoboxError, NotFound
from .. import _procs
from .._base import StreamEvent
from .._sse import OutputCallback
from ._http import output_stream

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox


class AsyncProcess:
    """One background process (by ``pid``) of a sandbox; build it with ``sbx.processes.start`` or ``connect``.

    ``info`` is what the API said when this object was made (``running``/``exit_code`` are not refreshed).
    """

    def __init__(self, sandbox: AsyncSandbox, info: models.Process) -> None:
        self._sbx = sandbox
        self.info = info

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def tag(self) -> str | None:
        return self.info.tag

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pid={self.pid}, tag={self.tag!r}, cmd={self.info.cmd!r})"

    async def stream(
        self, on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None
    ) -> AsyncGenerator[StreamEvent]:
        """Yield ``stdout`` / ``stderr`` events, from what the process printed so far to its live output, then one
        ``exit`` event (``exit_code`` ``-1`` when a signal ended it).

        ``on_stdout`` / ``on_stderr``, when given, are also called with each chunk. Stop early by closing the
        iterator (``contextlib.aclosing``): that only detaches, the process keeps running.

        :raises NotFound: the guest does not know this process (any more).
        :raises GuestError: the stream ended without an exit code.
        """
        request = _procs.stream_request(self._sbx.id, self.pid, client_timeout_s=self._sbx._config.timeout_s)
        ended_early = functools.partial(_procs.stream_ended_early, self.pid)
        events = output_stream(self._sbx._http, request, on_stdout, on_stderr, ended_early)
        async with contextlib.aclosing(events):
            async for event in events:  # noqa: UP028 (`yield from` in the sync twin)
                yield event

    async def wait(self, timeout_seconds: float | None = None) -> models.ProcessResult:
        """Wait for the process to end: its exit code, status and everything it printed.

        :raises SandboxTimeout: it still runs after ``timeout_seconds`` (it keeps running; ``details`` holds the
            output so far).
        :raises NotFound: the guest does not know this process (any more).
        """
        request = _procs.wait_request(
            self._sbx.id, self.pid, timeout_seconds=timeout_seconds, client_timeout_s=self._sbx._config.timeout_s
        )
        return _procs.parse_result(await self._sbx._send(request))

    async def send_stdin(self, data: str | bytes) -> None:
        """Write ``data`` (``str`` is UTF-8 encoded) to the process's stdin (or terminal).

        :raises InvalidArgument: it was started without ``stdin=True`` (or its stdin is closed).
        """
        await self._sbx._send(_procs.input_request(self._sbx.id, self.pid, data=data))

    async def close_stdin(self) -> None:
        """Close the process's stdin: it reads end of file."""
        await self._sbx._send(_procs.input_request(self._sbx.id, self.pid, eof=True))

    async def signal(self, sig: int | str) -> None:
        """Send ``sig`` (a number, ``signal.SIGTERM``, or a name: ``"SIGTERM"``, ``"TERM"``, ``"KILL"``…).

        :raises InvalidArgument: not a signal.
        :raises NotFound: the process has ended.
        """
        await self._sbx._send(_procs.signal_request(self._sbx.id, self.pid, sig))

    async def kill(self) -> None:
        """SIGKILL the process.

        :raises NotFound: the process has ended.
        """
        await self._sbx._send(_procs.kill_request(self._sbx.id, self.pid))


class AsyncProcesses:
    """The background processes of one sandbox (``sbx.processes``)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    async def start(
        self,
        cmd: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        tag: str | None = None,
        stdin: bool = False,
    ) -> AsyncProcess:
        """Start ``cmd`` with ``/bin/sh -c`` in the background and return once it runs.

        ``tag`` names it for ``list()``; ``stdin`` keeps its stdin open for ``send_stdin`` (otherwise it reads
        ``/dev/null``).
        """
        request = _procs.start_request(self._sbx.id, cmd, env=env, cwd=cwd, tag=tag, stdin=stdin)
        return AsyncProcess(self._sbx, _procs.parse_process(await self._sbx._send(request)))

    async def _start_fed(
        self, cmd: str, *, env: Mapping[str, str] | None, cwd: str | None, stdin: str | None
    ) -> AsyncProcess:
        """``exec(..., background=True)``: start ``cmd``; with ``stdin``, write it and close its stdin."""
        process = await self.start(cmd, env=env, cwd=cwd, stdin=stdin is not None)
        if stdin is None:
            return process
        try:
            await process.send_stdin(stdin)
            await process.close_stdin()
        except BaseException:
            with contextlib.suppress(CryoboxError):  # do not leave it waiting for input no one will send
                await process.kill()
            raise
        return process

    async def list(self) -> builtins.list[models.Process]:
        """The guest's background processes, running ones and recently ended ones."""
        return _procs.parse_process_list(await self._sbx._send(_procs.list_request(self._sbx.id)))

    async def connect(self, pid: int) -> AsyncProcess:
        """An object for the process ``pid`` (one this or another client started).

        :raises NotFound: the guest does not list it.
        """
        for info in await self.list():
            if info.pid == pid:
                return AsyncProcess(self._sbx, info)
        raise NotFound(f"no process {pid} in sandbox {self._sbx.id}", details={"pid": pid})
