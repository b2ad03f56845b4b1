"""The code interpreter of a sandbox (template ``code-interpreter``): ``sbx.run_code`` and ``sbx.code_contexts``.

Cells run in Jupyter kernels inside the guest; a context is one kernel, so variables and imports persist across
``run_code`` calls in it, and each context's are its own. Results come back rich (``Result``: ``text``, ``html``
for a DataFrame, ``png`` for a matplotlib figure, …). Example::

    execution = await sbx.run_code("import pandas as pd; pd.DataFrame({'a': [1, 2]})")
    print(execution.results[0].html)  # "<div>…<table …"
    scratch = await sbx.code_contexts.create()
    await sbx.run_code("x = 1", context=scratch)
    execution = await sbx.run_code("x", context=scratch, on_stdout=print)
    print(execution.text)  # "1"
    await sbx.code_contexts.remove(scratch)

A sandbox without a code interpreter (template ``base``) raises ``StateError``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Mapping

import httpx

from ... import models
from .. import _code
from .._base import ClientConfig, RetryPolicy
from .._code import CodeContext, ContextRef, ErrorCallback, Execution, OutputCallback, ResultCallback
from .._requests import ApiRequest
from ._http import send, stream_lines


class AsyncCodeContexts:
    """The contexts (kernels) of one sandbox's code interpreter (``sbx.code_contexts``). The ``default`` context
    is always there: it is where ``run_code`` runs without ``context``."""

    def __init__(self, sandbox: AsyncCodeInterpreter) -> None:
        self._sbx = sandbox

    async def _send(self, request: ApiRequest) -> httpx.Response:
        return await send(self._sbx._http, request, self._sbx._retry)

    async def create(self, language: str = "python", cwd: str | None = None) -> CodeContext:
        """A new kernel (``python``), working in ``cwd`` (default: the user's home).

        :raises InvalidArgument: the language is not available.
        :raises StateError: the sandbox runs no code interpreter.
        """
        request = _code.create_context_request(self._sbx.info.id, language=language, cwd=cwd)
        return _code.parse_context(await self._send(request))

    async def list(self) -> builtins.list[CodeContext]:
        """Every context, ``default`` included."""
        return _code.parse_context_list(await self._send(_code.list_contexts_request(self._sbx.info.id)))

    async def remove(self, context: ContextRef) -> None:
        """Shut the context's kernel down.

        :raises InvalidArgument: it is the ``default`` context (restart it instead).
        :raises NotFound: no such context.
        """
        await self._send(_code.remove_context_request(self._sbx.info.id, context))

    async def restart(self, context: ContextRef) -> None:
        """A fresh kernel for the context: all its state is gone.

        :raises NotFound: no such context.
        """
        await self._send(_code.restart_context_request(self._sbx.info.id, context))


class AsyncCodeInterpreter:
    """What a sandbox object needs to run code (``AsyncSandbox`` has it): ``run_code`` and ``code_contexts``."""

    info: models.Sandbox
    _http: httpx.AsyncClient
    _config: ClientConfig
    _retry: RetryPolicy

    @functools.cached_property
    def code_contexts(self) -> AsyncCodeContexts:
        return AsyncCodeContexts(self)

    async def run_code(
        self,
        code: str,
        *,
        context: ContextRef | None = None,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_result: ResultCallback | None = None,
        on_error: ErrorCallback | None = None,
    ) -> Execution:
        """Run ``code`` as one cell in ``context`` (default: the ``default`` context) and return its
        :class:`Execution`; the callbacks are called with each output as it arrives.

        A cell that raises is not an exception here: ``execution.error`` says what it raised. ``timeout_seconds``
        (``None``: no limit) interrupts the cell: its error is then a ``TimeoutError`` and the context keeps its
        state. ``env`` is set in the kernel's ``os.environ`` before the cell runs.

        :raises StateError: the sandbox runs no code interpreter (template ``base``).
        :raises NotFound: no such context.
        """
        request = _code.run_request(
            self.info.id,
            code,
            context=context,
            timeout_seconds=timeout_seconds,
            env=env,
            client_timeout_s=self._config.timeout_s,
        )
        stream = _code.ExecutionStream(on_stdout=on_stdout, on_stderr=on_stderr, on_result=on_result, on_error=on_error)
        async with contextlib.aclosing(stream_lines(self._http, request)) as lines:
            async for line in lines:
                if stream.feed(line):
                    break
        return stream.execution()
