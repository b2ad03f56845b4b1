"""Every agent operation defined once: the :class:`~.interface.Agent` protocol's methods carry how they cross HTTP
(the decorators here), and :func:`operations_of` reads each back as an :class:`Op`, from which the three
transports are derived (:mod:`.inprocess`, :mod:`.http_client`, :mod:`.http_routes`). Adding an operation is a
decorated method on the protocol and its implementation in the agent; nothing else is written by hand.

The method's signature says what goes in and what comes back; the decorator says how that travels:

- a parameter named in the route (``{sandbox_id}``; ``{name:path}`` admits slashes) is a path segment,
  percent-encoded by the client;
- a parameter listed in ``query`` is a query parameter (``None`` is left out, booleans are ``true``/``false``);
- a pydantic model parameter is the JSON body, a ``bytes`` one the raw body (at most ``max_body`` bytes);
  the other parameters (``op``, ``cols``, ``keep``...) are the members of a JSON object body;
- a route segment that is no parameter is the body model's field of that name (the server refuses a body that
  names another: ``wake_stored``'s ``sandbox_id``);
- the reply: ``None`` is ``204`` without a body; a model or a list of models is JSON; ``bytes`` is the raw body
  (``media_type``); with ``reply_key`` the value is the one member of a JSON object (``{"bytes": 7}``); an
  ``AsyncIterator[M]`` is an NDJSON stream of ``M`` (see :mod:`.http_streams`);
- ``timeout``: how long the HTTP client waits for an answer (:class:`Timeout`).

An operation the generic forms do not fit is declared with :func:`custom` and written by hand where it differs.
This module knows no transport: it only describes.
"""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, create_model

F = TypeVar("F", bound=Callable[..., Any])
Check = Callable[[Mapping[str, Any]], None]
ROUTE_ATTRIBUTE = "__agent_route__"


class Timeout(enum.Enum):
    """How long the HTTP client waits for an answer (connecting is always bounded)."""

    DEFAULT = "default"
    """The client's own timeout."""
    LONG = "long"
    """Minutes of disk and network work (snapshots, forks, uploads to the store): never a short read timeout."""
    NONE = "none"
    """No read timeout: a terminal, a process or a build may stay quiet as long as it likes."""
    EXEC = "exec"
    """The command's own ``timeout_s`` (the body's) plus a margin; none when it has none."""


class Reply(enum.Enum):
    NONE = "none"
    JSON = "json"
    BYTES = "bytes"
    KEYED = "keyed"
    STREAM = "stream"


class Arg(enum.Enum):
    PATH = "path"
    QUERY = "query"
    MODEL = "model"
    FIELD = "field"
    RAW = "raw"


@dataclass(frozen=True)
class Query:
    """A query parameter's constraints (checked by the agent's server: ``400 invalid_argument`` otherwise)."""

    min_length: int | None = None
    max_length: int | None = None
    description: str = ""


@dataclass(frozen=True)
class Route:
    """What a decorator records on a protocol method."""

    method: str
    path: str | None
    query: Mapping[str, Query] = field(default_factory=lambda: MappingProxyType({}))
    timeout: Timeout = Timeout.DEFAULT
    max_body: int | None = None
    media_type: str = "application/octet-stream"
    reply_key: str | None = None
    check: Check | None = None
    custom: str = ""


def _route(method: str) -> Callable[..., Callable[[F], F]]:
    def decorator(
        path: str,
        *,
        query: Mapping[str, Query] | None = None,
        timeout: Timeout = Timeout.DEFAULT,
        max_body: int | None = None,
        media_type: str = "application/octet-stream",
        reply_key: str | None = None,
        check: Check | None = None,
    ) -> Callable[[F], F]:
        route = Route(
            method, path, MappingProxyType(dict(query or {})), timeout, max_body, media_type, reply_key, check
        )

        def mark(method: F) -> F:
            setattr(method, ROUTE_ATTRIBUTE, route)
            return method

        return mark

    return decorator


get = _route("GET")
post = _route("POST")
put = _route("PUT")
patch = _route("PATCH")
delete = _route("DELETE")


def custom(why: str) -> Callable[[F], F]:
    """An operation with no generic HTTP route: the HTTP client's method and the agent's route are written by
    hand (``why`` says where); the in-process transport is still derived."""

    def mark(method: F) -> F:
        setattr(method, ROUTE_ATTRIBUTE, Route("", None, custom=why))
        return method

    return mark


@dataclass(frozen=True)
class Param:
    name: str
    arg: Arg
    annotation: Any
    default: Any
    query: Query | None = None

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


@dataclass(frozen=True)
class Op:
    """One operation: the protocol method ``name`` and how it crosses HTTP."""

    name: str
    signature: inspect.Signature
    """The protocol method's, ``self`` left out."""
    params: tuple[Param, ...]
    route: Route
    reply: Reply
    reply_type: Any
    """The model, ``list[model]``, ``bytes``, ``int``..., or a stream's item model."""
    from_body: tuple[str, ...]
    """Route segments that are fields of the body model."""
    wire_type: Any
    """What a JSON reply is on the wire: ``reply_type``, or for ``KEYED`` the object holding it (else ``None``)."""
    reply_adapter: TypeAdapter[Any] | None
    """Validates ``wire_type``."""
    fields_model: type[BaseModel] | None
    """The JSON object body of ``FIELD`` parameters."""
    doc: str | None

    @property
    def streamed(self) -> bool:
        return self.reply is Reply.STREAM

    @property
    def method(self) -> str:
        return self.route.method

    @property
    def path(self) -> str | None:
        return self.route.path

    def of(self, arg: Arg) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.arg is arg)

    def body_model(self, arguments: Mapping[str, Any]) -> BaseModel | None:
        models = self.of(Arg.MODEL)
        return arguments[models[0].name] if models else None

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A call's arguments by name, defaults applied (``TypeError`` as for the method itself)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def call_args(self, arguments: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``arguments`` as the protocol method takes them: positional, then keyword-only."""
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for parameter in self.signature.parameters.values():
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
                keywords[parameter.name] = arguments[parameter.name]
            else:
                positional.append(arguments[parameter.name])
        return positional, keywords


def route_names(path: str) -> list[str]:
    """The names in a route's ``{...}`` segments (``{name:path}`` is ``name``)."""
    return [part[1:-1].split(":", 1)[0] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _arg(name: str, annotation: Any, route: Route, segments: list[str]) -> Arg:
    if name in segments:
        return Arg.PATH
    if name in route.query:
        return Arg.QUERY
    if _is_model(annotation):
        return Arg.MODEL
    if annotation is bytes:
        return Arg.RAW
    return Arg.FIELD


def _reply(name: str, annotation: Any, route: Route, streamed: bool) -> tuple[Reply, Any]:
    if streamed:
        if typing.get_origin(annotation) is not AsyncIterator:
            raise TypeError(f"{name}: a stream returns AsyncIterator[model]")
        return Reply.STREAM, typing.get_args(annotation)[0]
    if route.reply_key is not None:
        return Reply.KEYED, annotation
    if annotation is None or annotation is type(None):
        return Reply.NONE, None
    if annotation is bytes:
        return Reply.BYTES, bytes
    item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
    if not _is_model(item):
        raise TypeError(f"{name}: a JSON reply is a model or a list of models (or give reply_key)")
    return Reply.JSON, annotation


def _title(name: str) -> str:
    return "".join(word.capitalize() for word in name.split("_"))


def _op(name: str, method: Callable[..., Any], route: Route) -> Op:
    hints = typing.get_type_hints(method)
    signature = inspect.signature(method)
    parameters = [p for p in signature.parameters.values() if p.name != "self"]
    segments = route_names(route.path) if route.path is not None else []
    params = tuple(
        Param(p.name, _arg(p.name, hints[p.name], route, segments), hints[p.name], p.default, route.query.get(p.name))
        for p in parameters
    )
    streamed = not inspect.iscoroutinefunction(method)
    reply, reply_type = _reply(name, hints["return"], route, streamed)
    bodies = {p.arg for p in params} & {Arg.MODEL, Arg.RAW, Arg.FIELD}
    models = [p for p in params if p.arg is Arg.MODEL]
    from_body = tuple(s for s in segments if s not in {p.name for p in params})
    if route.path is not None:
        if len(bodies) > 1 or len(models) > 1 or (bodies and route.method in ("GET", "DELETE")):
            raise TypeError(f"{name}: one body at most, and none on {route.method}")
        if from_body and not (models and all(s in models[0].annotation.model_fields for s in from_body)):
            raise TypeError(f"{name}: route segments {from_body} are neither parameters nor body fields")
        if streamed and not models:
            raise TypeError(f"{name}: a stream's request is a model")
    fields = [p for p in params if p.arg is Arg.FIELD]
    fields_model = None
    if fields and route.path is not None:
        definitions: dict[str, Any] = {p.name: (p.annotation, ... if p.required else p.default) for p in fields}
        fields_model = create_model(f"{_title(name)}Body", **definitions)
    wire: Any = None
    if reply is Reply.JSON:
        wire = reply_type
    elif reply is Reply.KEYED and route.reply_key is not None:
        member: dict[str, Any] = {route.reply_key: (reply_type, ...)}
        wire = create_model(f"{_title(name)}Reply", __config__=ConfigDict(strict=True), **member)
    adapter = TypeAdapter(wire) if wire is not None else None
    parameters_only = signature.replace(parameters=parameters)
    return Op(
        name, parameters_only, params, route, reply, reply_type, from_body, wire, adapter, fields_model, method.__doc__
    )


def operations_of(protocol: type) -> Mapping[str, Op]:
    """The operations declared on ``protocol``'s methods, in declaration order (read-only)."""
    found: dict[str, Op] = {}
    for name, member in vars(protocol).items():
        route = getattr(member, ROUTE_ATTRIBUTE, None)
        if isinstance(route, Route):
            found[name] = _op(name, member, route)
    return MappingProxyType(found)


C = TypeVar("C", bound=type)


def install(operations: Mapping[str, Op], make: Callable[[Op], Callable[..., Any]]) -> Callable[[C], C]:
    """A class decorator: ``make(op)`` becomes the class's method for every operation it does not define itself
    (those are its hand-written ones), with the protocol method's name, signature and docstring."""

    def decorate(cls: C) -> C:
        for op in operations.values():
            if op.name in vars(cls):
                continue
            method = make(op)
            method.__name__ = op.name
            method.__qualname__ = f"{cls.__qualname__}.{op.name}"
            method.__doc__ = op.doc
            method.__signature__ = op.signature.replace(  # type: ignore[attr-defined]
                parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                + list(op.signature.parameters.values())
            )
            setattr(cls, op.name, method)
        return cls

    return decorate


__all__ = [
    "Arg",
    "Op",
    "Param",
    "Query",
    "Reply",
    "Route",
    "Timeout",
    "custom",
    "delete",
    "get",
    "install",
    "operations_of",
    "patch",
    "post",
    "put",
    "route_names",
]
