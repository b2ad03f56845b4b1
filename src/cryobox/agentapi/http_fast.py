"""The hot operations' routes without FastAPI's layers: plain ASGI in front of the agent app.

Creates, execs, gets and deletes are what every fleet call pays the hop for (issue 37). FastAPI's request handling
(dependency solving, the body parsed to Python objects and then validated, the reply validated again against its
response model and encoded by ``jsonable_encoder``) was half of the agent's CPU time per call. Here an operation
whose wire form is plain (path segments, at most one model body, a JSON reply or none) is answered directly: the
body decoded and validated by FastAPI's rules (:func:`parse_body`), the reply dumped by the operation's adapter.
Everything else, and any request these routes do not match, goes on to FastAPI. The answers are FastAPI's: the same
status codes, the same error bodies (``{"error", "code", "details"}``; a body that does not validate is ``400
invalid_argument`` with the problems under ``details.errors``, located from ``body`` as FastAPI does); a test sends
the same requests both ways and compares.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import CryoboxError
from .http_errors import cryobox_error_response, error_response, invalid_response
from .interface import Agent
from .operations import Arg, Op, Reply

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]


def fits(op: Op) -> bool:
    """Whether ``op``'s wire form is plain enough for these routes."""
    if op.path is None or op.streamed or op.from_body or op.reply not in (Reply.JSON, Reply.NONE):
        return False
    if any(p.arg in (Arg.QUERY, Arg.RAW, Arg.FIELD) for p in op.params):
        return False
    return ":" not in op.path  # no ``{name:path}`` segments


@dataclass(frozen=True)
class _Route:
    op: Op
    pattern: re.Pattern[str]
    """Starlette's own, for the route's path: what FastAPI would match."""
    body: tuple[str, type[BaseModel]] | None
    """The model parameter's name and model."""
    call: Any


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def parse_body(model: type[BaseModel], body: bytes, content_type: str | None) -> BaseModel | list[dict[str, Any]]:
    """The body as ``model``, or the problems FastAPI would list (its rules: an empty body is a missing one; a body
    not declared JSON is validated as bytes; JSON is decoded, then validated)."""
    if not body:
        return [{"loc": ["body"], "msg": "Field required"}]
    value: Any = body
    if content_type is not None and _is_json(content_type):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            return [{"loc": ["body", str(err.pos)], "msg": "JSON decode error"}]
    try:
        return model.model_validate(value, from_attributes=True)  # as FastAPI validates a body field
    except ValidationError as err:
        return [
            {"loc": ["body", *(str(p) for p in item["loc"])], "msg": str(item["msg"])}
            for item in err.errors(include_url=False)
        ]


class FastRoutes:
    """ASGI middleware answering ``ops`` of ``agent`` under ``prefix`` itself; the rest goes to ``app``."""

    def __init__(self, app: ASGIApp, agent: Agent, ops: Iterable[Op], prefix: str) -> None:
        self.app = app
        self._routes: dict[str, list[_Route]] = {}
        for op in ops:
            if not fits(op):
                raise ValueError(f"{op.name} does not fit the fast routes")
            assert op.path is not None
            pattern, _, _ = compile_path(prefix + op.path)  # every segment ``str``: fits() refuses ``{name:path}``
            models = op.of(Arg.MODEL)
            body = (models[0].name, models[0].annotation) if models else None
            self._routes.setdefault(op.method, []).append(_Route(op, pattern, body, getattr(agent, op.name)))

    def _find(self, method: str, path: str) -> tuple[_Route, dict[str, Any]] | None:
        for route in self._routes.get(method, ()):
            found = route.pattern.match(path)
            if found is not None:
                return route, found.groupdict()
        return None

    def match(self, method: str, path: str) -> tuple[Op, dict[str, Any]] | None:
        """The operation answering ``method path`` here, and its path segments; ``None``: FastAPI's to answer."""
        hit = self._find(method, path)
        return (hit[0].op, hit[1]) if hit is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = self._find(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if hit is None:
            await self.app(scope, receive, send)
            return
        await self._serve(hit[0], hit[1], scope, receive, send)

    async def _serve(
        self, route: _Route, arguments: dict[str, Any], scope: Scope, receive: Receive, send: Send
    ) -> None:
        op = route.op
        try:
            if route.body is not None:
                name, model = route.body
                parsed = parse_body(model, await _body(receive), _header(scope, b"content-type"))
                if isinstance(parsed, list):
                    await _answer(send, 400, bytes(invalid_response(parsed).body))
                    return
                arguments[name] = parsed
            if op.route.check is not None:
                op.route.check(arguments)
            positional, keywords = op.call_args(arguments)
            result = await route.call(*positional, **keywords)
        except CryoboxError as exc:
            response = cryobox_error_response(exc)
            await _answer(send, response.status_code, bytes(response.body), response.raw_headers)
            return
        except Exception:
            log.exception("agent request %s %s failed", op.method, op.path)
            response = error_response(500, "internal error", "internal")
            await _answer(send, 500, bytes(response.body))
            return
        if op.reply is Reply.NONE:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        assert op.reply_adapter is not None
        await _answer(send, 200, op.reply_adapter.dump_json(result, by_alias=True))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    if headers is None:
        headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["FastRoutes", "fits"]
