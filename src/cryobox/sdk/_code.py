"""The IO-free part of the code interpreter (shared by both clients): the result types, the requests of
``/v1/sandboxes/{id}/code/…``, and the decoding of ``…/code/run/stream``'s server-sent events into an
:class:`Execution`, handing each output to its callback as it arrives.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from .. import models
from ..errors import GuestError
from ._base import parse_model
from ._requests import ApiRequest, _sandbox_path, exec_timeout
from ._sse import SSEDecoder, stream_error

FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript")
STREAM_ENDED_EARLY = "the code stream ended before the cell finished"

# --- results ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One rich output of a cell, in every representation IPython made of it: ``text`` (always, for an object),
    ``html`` (a DataFrame), ``png`` / ``jpeg`` / ``pdf`` (base64: a matplotlib figure), ``svg``, ``markdown``,
    ``latex``, ``json`` (decoded), ``javascript``; other MIME types in ``extra``. ``is_main_result``: the cell's
    value (its last expression), rather than a ``display()`` call or a shown figure."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    is_main_result: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def formats(self) -> list[str]:
        """The representations this result has (``"text"``, ``"html"``, ``"png"``…, then ``extra``'s types)."""
        return [name for name in FORMATS if getattr(self, name) is not None] + list(self.extra)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Result:
        def text(name: str) -> str | None:
            value = data.get(name)
            return value if isinstance(value, str) else None

        extra = data.get("extra")
        return cls(
            text=text("text"),
            html=text("html"),
            markdown=text("markdown"),
            svg=text("svg"),
            png=text("png"),
            jpeg=text("jpeg"),
            pdf=text("pdf"),
            latex=text("latex"),
            json=data.get("json"),
            javascript=text("javascript"),
            is_main_result=data.get("is_main_result") is True,
            extra=dict(extra) if isinstance(extra, dict) else {},
        )


@dataclass(frozen=True)
class ExecutionError:
    """The exception a cell raised: ``name`` (its class), ``value`` (its message) and the formatted ``traceback``.
    A cell stopped by ``timeout_seconds`` has ``name`` ``TimeoutError``; its context keeps its state."""

    name: str
    value: str
    traceback: str = ""


@dataclass(frozen=True)
class Logs:
    """What a cell printed, chunk by chunk as it arrived."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Execution:
    """One cell's outcome: its ``results``, ``logs``, ``error`` (``None`` when it ran through), the context's
    ``execution_count`` after it and its duration as the control plane measured it."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    duration_ms: float = 0.0

    @property
    def text(self) -> str | None:
        """The main result's text (the cell's value), if it had one."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None


@dataclass(frozen=True)
class CodeContext:
    """A kernel of the sandbox's code interpreter: its variables, imports and working directory are its own."""

    id: str
    language: str = "python"
    cwd: str = ""


ContextRef = CodeContext | str
OutputCallback = Callable[[str], object]
ResultCallback = Callable[[Result], object]
ErrorCallback = Callable[[ExecutionError], object]

# --- requests --------------------------------------------------------------------------------------------------


def _context_id(context: ContextRef) -> str:
    return context.id if isinstance(context, CodeContext) else context


def _code_path(sandbox_id: str, suffix: str) -> str:
    return _sandbox_path(sandbox_id, "/code" + suffix)


def _context_path(sandbox_id: str, context: ContextRef, suffix: str = "") -> str:
    return _code_path(sandbox_id, f"/contexts/{quote(_context_id(context), safe='')}{suffix}")


def run_request(
    sandbox_id: str,
    code: str,
    *,
    context: ContextRef | None,
    timeout_seconds: float | None,
    env: Mapping[str, str] | None,
    client_timeout_s: float,
) -> ApiRequest:
    """The streamed run: the HTTP read timeout never cuts a cell short (at least its timeout plus a margin)."""
    body: dict[str, Any] = {"code": code, "timeout_seconds": timeout_seconds, "env": dict(env or {})}
    if context is not None:
        body["context_id"] = _context_id(context)
    timeout = exec_timeout(client_timeout_s, timeout_seconds)
    return ApiRequest("POST", _code_path(sandbox_id, "/run/stream"), json=body, timeout=timeout)


def create_context_request(sandbox_id: str, *, language: str, cwd: str | None) -> ApiRequest:
    body: dict[str, Any] = {"language": language}
    if cwd is not None:
        body["cwd"] = cwd
    return ApiRequest("POST", _code_path(sandbox_id, "/contexts"), json=body)


def list_contexts_request(sandbox_id: str) -> ApiRequest:
    return ApiRequest("GET", _code_path(sandbox_id, "/contexts"))


def remove_context_request(sandbox_id: str, context: ContextRef) -> ApiRequest:
    return ApiRequest("DELETE", _context_path(sandbox_id, context))


def restart_context_request(sandbox_id: str, context: ContextRef) -> ApiRequest:
    return ApiRequest("POST", _context_path(sandbox_id, context, "/restart"))


# --- responses -------------------------------------------------------------------------------------------------


def _context(model: models.CodeContext) -> CodeContext:
    return CodeContext(id=model.id, language=model.language, cwd=model.cwd)


def parse_context(response: httpx.Response) -> CodeContext:
    return _context(parse_model(models.CodeContext, response))


def parse_context_list(response: httpx.Response) -> list[CodeContext]:
    return [_context(item) for item in parse_model(models.CodeContextList, response).items]


class ExecutionStream:
    """Lines of ``…/code/run/stream`` in; each output handed to its callback as it completes; :meth:`execution` at
    the end. :meth:`feed` answers ``True`` once the ``end`` event came (nothing follows it)."""

    def __init__(
        self,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_result: ResultCallback | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        self._sse = SSEDecoder()
        self._on_stdout, self._on_stderr, self._on_result, self._on_error = on_stdout, on_stderr, on_result, on_error
        self.results: list[Result] = []
        self.logs = Logs()
        self.error: ExecutionError | None = None
        self.end: dict[str, Any] | None = None

    def feed(self, line: str) -> bool:
        """:raises CryoboxError: a ``failure`` event (mapped by its code), or malformed data."""
        message = self._sse.feed(line)
        if message is None or self.end is not None:
            return self.end is not None
        try:
            data = json.loads(message.data)
        except ValueError as err:
            raise GuestError(f"malformed code stream data for {message.event!r}: {message.data[:200]!r}") from err
        if not isinstance(data, dict):
            raise GuestError(f"malformed code stream data for {message.event!r}: {message.data[:200]!r}")
        self._dispatch(message.event, data)
        return self.end is not None

    def _dispatch(self, event: str, data: dict[str, Any]) -> None:
        if event in ("stdout", "stderr"):
            text = str(data.get("text", ""))
            (self.logs.stdout if event == "stdout" else self.logs.stderr).append(text)
            callback = self._on_stdout if event == "stdout" else self._on_stderr
            if callback is not None:
                callback(text)
        elif event == "result":
            result = Result.from_wire(data)
            self.results.append(result)
            if self._on_result is not None:
                self._on_result(result)
        elif event == "error":
            self.error = ExecutionError(
                str(data.get("name", "")), str(data.get("value", "")), str(data.get("traceback", ""))
            )
            if self._on_error is not None:
                self._on_error(self.error)
        elif event == "end":
            self.end = data
        elif event == "failure":
            raise stream_error(data)

    def execution(self) -> Execution:
        """:raises GuestError: the stream ended without its ``end`` event."""
        if self.end is None:
            raise GuestError(STREAM_ENDED_EARLY)
        count = self.end.get("execution_count")
        duration = self.end.get("duration_ms")
        return Execution(
            results=self.results,
            logs=self.logs,
            error=self.error,
            execution_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
            duration_ms=float(duration) if isinstance(duration, int | float) else 0.0,
        )
