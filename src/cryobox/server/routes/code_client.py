"""The control plane's client of a sandbox's code-interpreter server (guest port 49999, ``cryobox.guest.kernels``).

:class:`CodeClient` speaks E2B's code-interpreter protocol to it, through the sandbox's agent
(:meth:`~cryobox.agentapi.Agent.port_target`: the guest's address for the in-process agent, the agent's own port
route in a fleet) with the port proxy's shared HTTP client. ``execute`` yields the server's NDJSON output lines as
they arrive (``stdout``/``stderr`` ``{text, timestamp}``, ``result`` ``{is_main_result, text?, html?, png?, …}``,
``error`` ``{name, value, traceback}``, and ``number_of_executions`` ``{execution_count}`` last); :func:`collect`
folds such a stream into an execution (``{results, stdout, stderr, error, execution_count, duration_ms}``).

Every failure is translated here, once, into the error tree: nothing listening on the port (the sandbox runs no
code interpreter, e.g. template ``base``) is 409 ``wrong_state``; the server's own ``{"error"}`` answers keep
their meaning (400, 404, 409, 413; anything else is a ``GuestError``); a broken connection or a malformed line
is a ``GuestError``, a stream that went silent past its deadline a ``SandboxTimeout``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from ...agentapi.interface import Agent
from ...errors import (
    ERRORS_BY_CODE,
    CryoboxError,
    GuestError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    SandboxTimeout,
    StateError,
    Unauthorized,
)
from ...proxy.target import PortTarget
from .deps import Caller

PORT = 49999
CONNECT_TIMEOUT_S = 5.0
HARD_GRACE_S = 15.0
"""How long past its timeout a cell that keeps printing may go on (the server checks its deadline only while the
cell is quiet): past it the stream is cut off here."""
IDLE_READ_S = 300.0
"""The longest silence accepted from the server outside a cell's own time (a kernel's start or restart)."""
_GUEST_STATUS: dict[int, type[CryoboxError]] = {
    400: InvalidArgument,
    404: NotFound,
    409: StateError,
    413: PayloadTooLarge,
}


def _timeout(read_s: float | None) -> httpx.Timeout:
    return httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=read_s, write=IDLE_READ_S, pool=CONNECT_TIMEOUT_S)


def cell_timeout(timeout_s: float | None) -> httpx.Timeout:
    """A cell may be silent for as long as it runs: past its timeout the server interrupts it (and may restart
    the kernel), so the read deadline is its timeout plus the idle margin; none without a timeout."""
    return _timeout(None if timeout_s is None else timeout_s + IDLE_READ_S)


class CodeClient:
    """The code interpreter of one sandbox. ``template`` only names the sandbox's template in errors."""

    def __init__(self, agent: Agent, sandbox_id: str, http: httpx.AsyncClient, *, template: str | None = None) -> None:
        self.agent = agent
        self.sandbox_id = sandbox_id
        self.http = http
        self.template = template
        self._target: PortTarget | None = None

    # --- the one boundary ------------------------------------------------------------------------------------

    def _no_interpreter(self, reason: str) -> StateError:
        template = self.template or "unknown"
        hint = (
            "its code interpreter is not running"
            if template.startswith("code-interpreter")
            else "create the sandbox from the `code-interpreter` template to run code"
        )
        return StateError(
            f"sandbox {self.sandbox_id} (template {template!r}) runs no code interpreter: nothing listens on "
            f"port {PORT} ({reason}); {hint}",
            state=f"template {template}",
            required="template code-interpreter",
            details={"template": template, "port": PORT},
        )

    def _transport_error(self, error: httpx.TransportError) -> CryoboxError:
        if isinstance(error, httpx.ConnectError):
            return self._no_interpreter("connection refused")
        if isinstance(error, httpx.ConnectTimeout):
            return GuestError(f"the code interpreter of sandbox {self.sandbox_id} did not accept a connection in time")
        if isinstance(error, httpx.PoolTimeout):
            return GuestError("too many connections to sandbox ports at once; retry")
        if isinstance(error, httpx.TimeoutException):
            return SandboxTimeout(f"the code interpreter of sandbox {self.sandbox_id} stopped answering")
        return GuestError(f"the connection to the code interpreter of sandbox {self.sandbox_id} failed: {error}")

    def _response_error(self, response: httpx.Response) -> CryoboxError:
        """An error answer: the guest server's ``{"error"}``, or ours from an agent's port route (``code``)."""
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        message = str(body.get("error") or f"the code interpreter answered HTTP {response.status_code}")
        code = body.get("code")
        if code == "port_unreachable":  # the agent's port route found nothing listening
            return self._no_interpreter(message)
        if isinstance(code, str) and code in ERRORS_BY_CODE and code != Unauthorized.code:  # not the caller's key
            details = body.get("details")
            cls = ERRORS_BY_CODE[code]
            return cls(message, details=details if isinstance(details, dict) else {})
        return _GUEST_STATUS.get(response.status_code, GuestError)(f"code interpreter: {message}")

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as error:
            raise self._transport_error(error) from error

    async def _url(self, path: str) -> tuple[str, dict[str, str]]:
        if self._target is None:
            self._target = await self.agent.port_target(self.sandbox_id, PORT)
        return self._target.url + path, dict(self._target.headers)

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        url, headers = await self._url(path)
        with self._translated():
            response = await self.http.request(
                method,
                url,
                json=dict(body) if body is not None else None,
                headers=headers,
                timeout=_timeout(IDLE_READ_S),
            )
        if response.status_code >= 400:
            raise self._response_error(response)
        try:
            return json.loads(response.content) if response.content.strip() else None
        except ValueError as err:
            raise GuestError(f"the code interpreter answered {path} with malformed JSON") from err

    # --- the protocol ----------------------------------------------------------------------------------------

    async def execute(
        self,
        code: str,
        *,
        context_id: str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[dict[str, Any]]:
        """The cell's output lines as the server streams them. An error before the first line (no interpreter, an
        unknown context, a bad request) is raised by the first ``anext``; closing the iterator early closes the
        connection, which interrupts the cell (the context survives).

        The server interrupts a cell at ``timeout_s``; one still sending output :data:`HARD_GRACE_S` later is cut
        off here (the connection closed, which interrupts it at its next output) and ends with a ``TimeoutError``
        line and a ``number_of_executions`` without a count.
        """
        body: dict[str, Any] = {"code": code}
        if context_id is not None:
            body["context_id"] = context_id
        if timeout_s is not None:
            body["timeout"] = timeout_s
        if env:
            body["env_vars"] = dict(env)
        url, headers = await self._url("/execute")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s + HARD_GRACE_S
        with self._translated():
            async with self.http.stream(
                "POST", url, json=body, headers=headers, timeout=cell_timeout(timeout_s)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise self._response_error(response)
                async for raw in response.aiter_lines():
                    if not raw.strip():
                        continue
                    line = _line(raw)
                    yield line
                    if line["type"] == "number_of_executions":
                        return
                    if deadline is not None and time.monotonic() > deadline:
                        break
                else:
                    return
        limit = f"{timeout_s or 0:g}s"  # only a deadline breaks the loop
        yield {"type": "error", "name": "TimeoutError", "value": f"execution timed out after {limit} (cut off)"}
        yield {"type": "number_of_executions", "execution_count": None}

    async def contexts(self) -> list[dict[str, Any]]:
        listed = await self._call("GET", "/contexts")
        if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
            raise GuestError("the code interpreter listed its contexts in an unexpected shape")
        return listed

    async def create_context(self, language: str = "python", cwd: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"language": language}
        if cwd is not None:
            body["cwd"] = cwd
        made = await self._call("POST", "/contexts", body)
        if not isinstance(made, dict) or not isinstance(made.get("id"), str):
            raise GuestError("the code interpreter created a context without an id")
        return made

    async def remove_context(self, context_id: str) -> None:
        await self._call("DELETE", f"/contexts/{_segment(context_id)}")

    async def restart_context(self, context_id: str) -> None:
        await self._call("POST", f"/contexts/{_segment(context_id)}/restart")


async def for_sandbox(ctx: Caller, sandbox_id: str) -> CodeClient:
    """The code interpreter of the caller's sandbox ``sandbox_id`` (404 for another workspace's; a hibernated
    one is woken, inside its quota)."""
    row, agent = await ctx.control.route(sandbox_id, ctx.workspace_id)
    return CodeClient(agent, sandbox_id, ctx.app.proxy.client, template=row.template)


async def primed(lines: AsyncGenerator[dict[str, Any]]) -> AsyncGenerator[dict[str, Any]]:
    """``lines`` with its first line already read, so an error before it is raised here (a plain error response
    rather than a stream); the returned iterator yields it, then the rest, and closes ``lines`` when it closes."""
    try:
        first = await anext(lines)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await lines.aclose()
        raise

    async def chained() -> AsyncGenerator[dict[str, Any]]:
        async with contextlib.aclosing(lines):
            if first is None:
                return
            yield first
            async for line in lines:
                yield line

    return chained()


def _segment(context_id: str) -> str:
    """A context id as one path segment (percent-encoded; ``.`` and ``..`` would leave the route)."""
    if not context_id or context_id in (".", ".."):
        raise InvalidArgument(f"invalid context id {context_id!r}")
    return quote(context_id, safe="")


def _line(raw: str) -> dict[str, Any]:
    try:
        line = json.loads(raw)
    except ValueError as err:
        raise GuestError(f"the code interpreter sent a malformed output line: {raw[:200]!r}") from err
    if not isinstance(line, dict) or not isinstance(line.get("type"), str):
        raise GuestError(f"the code interpreter sent a malformed output line: {raw[:200]!r}")
    return line


# --- executions ------------------------------------------------------------------------------------------------


def result_of(line: Mapping[str, Any]) -> dict[str, Any]:
    """A ``result`` line as a result object (without its ``type``)."""
    return {k: v for k, v in line.items() if k != "type"}


def error_of(line: Mapping[str, Any]) -> dict[str, str]:
    return {
        "name": str(line.get("name") or "Error"),
        "value": str(line.get("value") or ""),
        "traceback": str(line.get("traceback") or ""),
    }


class ExecutionBuilder:
    """Folds output lines into an execution dict; ``done`` once the ``number_of_executions`` line came."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.results: list[dict[str, Any]] = []
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.error: dict[str, str] | None = None
        self.execution_count: int | None = None
        self.done = False

    def feed(self, line: Mapping[str, Any]) -> None:
        kind = line.get("type")
        if kind == "stdout":
            self.stdout.append(str(line.get("text", "")))
        elif kind == "stderr":
            self.stderr.append(str(line.get("text", "")))
        elif kind == "result":
            self.results.append(result_of(line))
        elif kind == "error":
            self.error = error_of(line)
        elif kind == "number_of_executions":
            count = line.get("execution_count")
            self.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
            self.done = True

    @property
    def duration_ms(self) -> float:
        return round((time.monotonic() - self.started) * 1000, 3)

    def execution(self) -> dict[str, Any]:
        """:raises GuestError: the stream ended before the cell finished."""
        if not self.done:
            raise GuestError("the code interpreter's stream ended before the cell finished")
        return {
            "results": self.results,
            "stdout": "".join(self.stdout),
            "stderr": "".join(self.stderr),
            "error": self.error,
            "execution_count": self.execution_count,
            "duration_ms": self.duration_ms,
        }


async def collect(lines: AsyncIterable[dict[str, Any]], *, started: float | None = None) -> dict[str, Any]:
    """A whole execution from its output lines: ``{results, stdout, stderr, error, execution_count, duration_ms}``
    (``duration_ms`` from ``started``, a ``time.monotonic()``, default now).

    :raises GuestError: the stream ended before the cell finished.
    """
    builder = ExecutionBuilder(started)
    async for line in lines:
        builder.feed(line)
    return builder.execution()
