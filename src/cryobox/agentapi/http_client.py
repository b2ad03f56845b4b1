"""The control plane's end of the agent HTTP API: :class:`HttpAgent` implements :class:`~.interface.Agent` over
the routes of :func:`~.http_server.create_agent_app`. Its methods are derived from
:data:`~.interface.OPERATIONS` (each one's request and reply forms, and timeout); only
:meth:`HttpAgent.port_target` is written here (it names the agent's port route, it sends nothing).

Error bodies are rebuilt into the same :mod:`cryobox.errors` class (message and details kept; ``Retry-After``
becomes ``retry_after_s``). Failing to reach the agent (connect error or timeout, nothing was sent) is
``HostUnavailable``; a transport failure after the request went out (the agent died or stalled mid-answer, so
the call may have taken effect) is a plain ``CryoboxError``. Streams are async generators over NDJSON lines:
close them (``aclose()`` or ``contextlib.aclosing``) when stopping early, which closes the HTTP response.

A call that is not a stream goes through :mod:`.http_conn` (keep-alive connections of its own, answers parsed by
httptools): it is the hop every create and exec of a fleet pays, and httpx's layers were a third of it. Streams go
through httpx. Given a ``transport`` (tests: an ASGI app, a mock), every call goes through it.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import httpx
from pydantic import BaseModel, ValidationError

from ..errors import ERRORS_BY_CODE, CryoboxError, HostUnavailable, InvalidArgument, QuotaExceeded
from ..proxy.target import PortTarget
from .http_conn import Answer, ConnectFailed, ConnectionPool, ExchangeFailed
from .interface import OPERATIONS
from .operations import Arg, Op, Reply, Timeout, install

PREFIX = "/agent/v1"
CONNECT_TIMEOUT_S = 10.0
EXEC_READ_MARGIN_S = 60.0
LONG_CALL_TIMEOUT_S = 3600.0
"""Snapshots, forks and uploads to the store: minutes of disk and network work, never a short read timeout."""
UNREACHABLE_RETRY_S = 2.0

_CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def _q(segment: str) -> str:
    return quote(segment, safe="")


def request_path(op: Op, arguments: dict[str, Any]) -> str:
    """``op``'s route with its segments filled in (percent-encoded), from the arguments or the body model."""
    assert op.path is not None
    body = op.body_model(arguments)
    parts = []
    for part in op.path.split("/"):
        if part.startswith("{") and part.endswith("}"):
            name = part[1:-1].split(":", 1)[0]
            part = _q(str(arguments[name] if name in arguments else getattr(body, name)))
        parts.append(part)
    return "/".join(parts)


def request_params(op: Op, arguments: dict[str, Any]) -> dict[str, str] | None:
    """The query parameters of a call of ``op`` (``None`` values left out, booleans as ``true``/``false``)."""
    names = [p.name for p in op.of(Arg.QUERY)]
    if not names:
        return None
    values = {name: arguments[name] for name in names if arguments[name] is not None}
    return {name: ("true" if v else "false") if isinstance(v, bool) else str(v) for name, v in values.items()}


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return None if math.isnan(seconds) or seconds < 0 else seconds


def rebuild_error(body: Any, *, status: int = 500, retry_after_s: float | None = None) -> CryoboxError:
    """The :class:`CryoboxError` a wire body ``{"error", "code", "details"}`` stands for."""
    body = body if isinstance(body, dict) else {}
    message = body.get("error")
    if not isinstance(message, str) or not message:
        message = f"agent answered HTTP {status}"
    details = body.get("details")
    details = dict(details) if isinstance(details, dict) else {}
    cls = ERRORS_BY_CODE.get(str(body.get("code") or ""))
    if cls is None:
        by_status = [c for c in ERRORS_BY_CODE.values() if c.http_status == status and c.http_status != 500]
        cls = by_status[0] if len(by_status) == 1 else CryoboxError
    if issubclass(cls, HostUnavailable | QuotaExceeded):
        return cls(message, retry_after_s=1.0 if retry_after_s is None else retry_after_s, details=details)
    return cls(message, details=details)  # StateError takes state/required from details


def error_from_answer(status: int, content: bytes, retry_after: str | None) -> CryoboxError:
    """The error an agent's answer with ``status`` ≥ 400 stands for."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    return rebuild_error(body, status=status, retry_after_s=_retry_after(retry_after))


def error_from_response(response: httpx.Response) -> CryoboxError:
    return error_from_answer(response.status_code, response.content, response.headers.get("retry-after"))


def _method(op: Op) -> Callable[..., Any]:
    """``op`` as an :class:`HttpAgent` method."""
    if op.streamed:

        def stream(self: HttpAgent, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            return self._stream(op, op.bind(args, kwargs))

        return stream

    async def call(self: HttpAgent, *args: Any, **kwargs: Any) -> Any:
        return await self._call(op, op.bind(args, kwargs))

    return call


@install(OPERATIONS, _method)
class HttpAgent:
    """An :class:`~.interface.Agent` reached over HTTP at ``url`` with the node ``token``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        name: str = "",
    ) -> None:
        if not token:
            raise InvalidArgument("an agent token is required")
        self.url = url.rstrip("/")
        self._token = token
        self.name = name
        self.timeout_s = timeout_s
        self._connect_s = min(CONNECT_TIMEOUT_S, timeout_s)
        if any(c in token for c in "\r\n\0"):
            raise InvalidArgument("an agent token is one line")
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": "cryobox-control-plane"}
        self._pool: ConnectionPool | None = None
        if transport is None:
            with contextlib.suppress(ValueError):  # not an http(s) URL: httpx's calls then fail as HostUnavailable
                self._pool = ConnectionPool(self.url, ssl_context=httpx.create_ssl_context)
        self._head = "".join(f"{name}: {value}\r\n" for name, value in self._headers.items())
        if self._pool is not None:
            self._head = f"Host: {self._pool.origin.host_header}\r\n{self._head}"
        # requests go straight to the connection pool, built here rather than by ``httpx.AsyncClient``: the client's
        # layers (URL merging, cookies, auth, redirects) were a third of the control plane's CPU per call to an
        # agent, and the hop's cost in ``bench fleet`` is mostly CPU time on a busy host. Open terminals and streams
        # each hold a connection: never make other calls queue behind them. The agent is reached directly, never
        # through a proxy named by the environment (HTTP_PROXY): it is a host of this deployment, not the internet.
        self._transport = transport or httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32)
        )

    def __repr__(self) -> str:
        return f"HttpAgent({self.url!r}, name={self.name!r})"

    async def __aenter__(self) -> HttpAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def port_target(self, sandbox_id: str, port: int) -> PortTarget:
        """The agent's own port route (``/agent/v1/sandboxes/<id>/ports/<port>``, node token attached): a port's
        traffic goes there, and the agent proxies it on to the guest (:mod:`.http_ports`)."""
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be 1-65535, got {port}", details={"port": port})
        return PortTarget(
            url=f"{self.url}{PREFIX}/sandboxes/{_q(sandbox_id)}/ports/{port}",
            headers={"Authorization": f"Bearer {self._token}"},
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        await self._transport.aclose()

    if TYPE_CHECKING:
        # the operations, installed by ``install`` above; typed as ``Agent``'s where the control plane holds one
        def __getattr__(self, name: str) -> Any: ...

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _read_s(self, op: Op, arguments: dict[str, Any]) -> float | None:
        """How long a call of ``op`` waits for its answer (``None``: however long it takes)."""
        if op.route.timeout is Timeout.LONG:
            return max(self.timeout_s, LONG_CALL_TIMEOUT_S)
        if op.route.timeout is Timeout.NONE:
            return None
        if op.route.timeout is Timeout.EXEC:
            limit = getattr(op.body_model(arguments), "timeout_s", None)
            return None if limit is None else limit + EXEC_READ_MARGIN_S
        return self.timeout_s

    def _transport_error(self, err: httpx.TransportError) -> CryoboxError:
        return self._unreachable(err) if isinstance(err, _CONNECT_FAILURES) else self._midway(err)

    def _unreachable(self, err: Exception) -> CryoboxError:
        return HostUnavailable(
            f"agent {self.name or self.url} is unreachable: {type(err).__name__}: {err}",
            retry_after_s=UNREACHABLE_RETRY_S,
            details={"agent": self.name},
        )

    def _midway(self, err: Exception) -> CryoboxError:
        return CryoboxError(
            f"request to agent {self.name or self.url} failed mid-way (it may have taken effect): "
            f"{type(err).__name__}: {err}",
            details={"agent": self.name},
        )

    def _request(self, op: Op, arguments: dict[str, Any]) -> httpx.Request:
        """The request of a call of ``op``: its path, query, body (its model, an object of its plain parameters, or
        its raw bytes), the node token and its timeout."""
        content, is_json = self._content(op, arguments)
        headers = {**self._headers, "Content-Type": "application/json"} if is_json else self._headers
        timeout = httpx.Timeout(self._read_s(op, arguments), connect=self._connect_s)
        return httpx.Request(
            op.method,
            self.url + PREFIX + request_path(op, arguments),
            params=request_params(op, arguments),
            headers=headers,
            content=content,
            extensions={"timeout": timeout.as_dict()},
        )

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """``request`` through the pool, its whole answer read."""
        try:
            response = await self._open(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
        except httpx.TransportError as err:
            raise self._transport_error(err) from err
        return response

    async def _open(self, request: httpx.Request) -> httpx.Response:
        """``request`` sent, its answer's head read (close it)."""
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    def _content(self, op: Op, arguments: dict[str, Any]) -> tuple[bytes | None, bool]:
        """A call's body (its model, an object of its plain parameters, or its raw bytes) and whether it is JSON."""
        raw = op.of(Arg.RAW)
        if raw:
            return arguments[raw[0].name], False
        body = op.body_model(arguments)
        if body is not None:
            return body.model_dump_json().encode(), True
        fields = op.of(Arg.FIELD)
        if fields:
            return json.dumps({p.name: arguments[p.name] for p in fields}, separators=(",", ":")).encode(), True
        return None, False

    async def _exchange(self, op: Op, arguments: dict[str, Any]) -> tuple[str, Answer]:
        """A call of ``op`` through the pool: its path, and the agent's whole answer."""
        assert self._pool is not None
        path = PREFIX + request_path(op, arguments)
        params = request_params(op, arguments)
        target = self._pool.origin.base_path + path + (f"?{urlencode(params)}" if params else "")
        content, is_json = self._content(op, arguments)
        head = f"{op.method} {target} HTTP/1.1\r\n{self._head}"
        if is_json:
            head += "Content-Type: application/json\r\n"
        if content is not None or op.method in ("POST", "PUT", "PATCH"):
            head += f"Content-Length: {len(content) if content is not None else 0}\r\n"
        try:
            answer = await self._pool.request(
                (head + "\r\n").encode(), content, connect_s=self._connect_s, read_s=self._read_s(op, arguments)
            )
        except ConnectFailed as err:
            raise self._unreachable(err) from err
        except ExchangeFailed as err:
            raise self._midway(err) from err
        return path, answer

    async def _call(self, op: Op, arguments: dict[str, Any]) -> Any:
        if self._pool is not None:
            path, answer = await self._exchange(op, arguments)
            status, content, retry_after = answer.status, answer.body, answer.headers.get("retry-after")
        else:
            response = await self._send(self._request(op, arguments))
            path, status = response.request.url.path, response.status_code
            content, retry_after = response.content, response.headers.get("retry-after")
        if status >= 400:
            raise error_from_answer(status, content, retry_after)
        if op.reply is Reply.NONE:
            return None
        if op.reply is Reply.BYTES:
            return content
        assert op.reply_adapter is not None
        try:
            reply = op.reply_adapter.validate_json(content)
        except ValidationError as err:
            raise self._unexpected(op.method, path, status, err) from err
        return getattr(reply, op.route.reply_key) if op.route.reply_key is not None else reply

    def _unexpected(self, method: str, path: str, status: int, err: Exception) -> CryoboxError:
        return CryoboxError(
            f"unexpected answer from agent {self.name or self.url} to {method} {path}: {err}",
            details={"agent": self.name, "status": status},
        )

    async def _stream(self, op: Op, arguments: dict[str, Any]) -> AsyncIterator[Any]:
        try:
            response = await self._open(self._request(op, arguments))
            try:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_from_response(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield self._stream_item(op.reply_type, line, response)
            finally:
                await response.aclose()
        except httpx.TransportError as err:
            raise self._transport_error(err) from err

    def _stream_item(self, model: type[BaseModel], line: str, response: httpx.Response) -> BaseModel:
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("a stream line is not a JSON object")
            if "error" in item:
                retry = item.get("retry_after_s")
                retry_s = float(retry) if isinstance(retry, int | float) else None
                raise rebuild_error(item["error"], retry_after_s=retry_s)
            return model.model_validate(item["event"])
        except (ValueError, KeyError) as err:  # includes ValidationError and JSONDecodeError
            request = response.request
            raise self._unexpected(request.method, request.url.path, response.status_code, err) from err


__all__ = ["HttpAgent", "error_from_answer", "error_from_response", "rebuild_error"]
