"""The agent HTTP server's routes, derived from :data:`~.interface.OPERATIONS`: one FastAPI route per operation,
whose endpoint FastAPI sees with the parameters the operation's wire form has (path segments, query parameters
with their constraints, the body model), so validation, status codes and errors are FastAPI's as for a route
written by hand.

A reply of ``None`` is ``204`` without a body, ``bytes`` the raw body, a stream NDJSON
(:func:`~.http_streams.ndjson_response`); raw request bodies are read up to the operation's ``max_body``
(:func:`cryobox.util.httpbody.read_body`). Operations declared ``custom`` get no route here (the port route is
:mod:`.http_ports`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from ..errors import InvalidArgument
from ..util.httpbody import read_body
from .http_streams import ndjson_response
from .interface import OPERATIONS, Agent
from .operations import Arg, Op, Param, Reply

_KW = inspect.Parameter.KEYWORD_ONLY
_BODY = "body"
_REQUEST = "raw_request"


def _query(param: Param) -> inspect.Parameter:
    spec = param.query
    assert spec is not None
    default = ... if param.required else param.default
    marker = Query(default, min_length=spec.min_length, max_length=spec.max_length, description=spec.description)
    return inspect.Parameter(param.name, _KW, annotation=param.annotation, default=marker)


def _signature(op: Op) -> inspect.Signature:
    """What FastAPI reads from the endpoint: path segments, query parameters, the body, the raw request."""
    assert op.path is not None
    params = [inspect.Parameter(p.name, _KW, annotation=str) for p in op.of(Arg.PATH)]
    params += [inspect.Parameter(name, _KW, annotation=str) for name in op.from_body]
    params += [_query(p) for p in op.of(Arg.QUERY)]
    models = op.of(Arg.MODEL)
    if models:
        params.append(inspect.Parameter(_BODY, _KW, annotation=models[0].annotation))
    elif op.fields_model is not None:
        params.append(inspect.Parameter(_BODY, _KW, annotation=op.fields_model))
    if op.of(Arg.RAW):
        params.append(inspect.Parameter(_REQUEST, _KW, annotation=Request))
    return inspect.Signature(params)


async def _arguments(op: Op, received: dict[str, Any]) -> dict[str, Any]:
    """The operation's arguments from what FastAPI parsed."""
    arguments = {p.name: received[p.name] for p in op.params if p.arg in (Arg.PATH, Arg.QUERY)}
    body = received.get(_BODY)
    for p in op.of(Arg.MODEL):
        arguments[p.name] = body
    for p in op.of(Arg.FIELD):
        arguments[p.name] = getattr(body, p.name)
    for p in op.of(Arg.RAW):
        assert op.route.max_body is not None
        arguments[p.name] = await read_body(received[_REQUEST], op.route.max_body)
    for name in op.from_body:
        if getattr(body, name) != received[name]:
            raise InvalidArgument(f"the body's {name} is not the one in the path", details={"id": received[name]})
    return arguments


def _endpoint(op: Op, call: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def endpoint(**received: Any) -> Any:
        arguments = await _arguments(op, received)
        if op.route.check is not None:
            op.route.check(arguments)
        positional, keywords = op.call_args(arguments)
        if op.reply is Reply.STREAM:
            return await ndjson_response(call(*positional, **keywords))
        result = await call(*positional, **keywords)
        if op.reply is Reply.NONE:
            return Response(status_code=204)
        if op.reply is Reply.BYTES:
            return Response(content=result, media_type=op.route.media_type)
        if op.route.reply_key is not None:
            return {op.route.reply_key: result}
        return result

    endpoint.__signature__ = _signature(op)  # type: ignore[attr-defined]
    endpoint.__name__ = op.name
    return endpoint


def _form(op: Op) -> dict[str, Any]:
    """The route's response declaration."""
    if op.reply is Reply.STREAM:
        return {"response_class": StreamingResponse, "response_model": None}
    if op.reply is Reply.NONE:
        return {"status_code": 204, "response_model": None}
    if op.reply is Reply.BYTES:
        return {"response_class": Response, "response_model": None}
    return {"response_model": op.wire_type}


HOT = ("exec", "exec_stream", "read_file", "write_file", "file_op", "get", "create", "delete")
"""Operations matched first: a request is matched against the routes in order (~5 µs each), and no two routes
match one path and method (a test checks), so the order changes nothing but the cost."""


def hot_first(op: Op) -> int:
    """A sort key: the operations of :data:`HOT` first, in its order."""
    return HOT.index(op.name) if op.name in HOT else len(HOT)


def add_operation_routes(
    router: APIRouter,
    agent: Agent,
    overrides: Mapping[str, Callable[..., Awaitable[Any]]] | None = None,
    *,
    prefix: str = "",
    skip: Collection[str] = (),
) -> None:
    """A route on ``router`` for every operation of ``agent`` that has one, but those named in ``skip`` (served
    elsewhere); ``overrides`` answers an operation with another callable than the agent's method
    (``metrics_text``: the agent process's whole registry)."""
    for op in sorted(OPERATIONS.values(), key=hot_first):
        if op.path is None or op.name in skip:
            continue
        call = (overrides or {}).get(op.name) or getattr(agent, op.name)
        router.add_api_route(prefix + op.path, _endpoint(op, call), methods=[op.method], name=op.name, **_form(op))


__all__ = ["HOT", "add_operation_routes", "hot_first"]
