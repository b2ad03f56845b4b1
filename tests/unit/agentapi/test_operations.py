"""The agent operations' table (``agentapi.OPERATIONS``, read from the ``Agent`` protocol's decorators) against
everything that must match it: the protocol itself, both transports, the agent app's routes, and the agents
(``HostAgent`` and the test fake). A new operation missing anywhere fails here, by name."""

from __future__ import annotations

import inspect
import re
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute

from cryobox.agent.hostagent.agent import HostAgent
from cryobox.agentapi import MAX_FILE_BYTES, OPERATIONS, Agent, HttpAgent, InProcessAgent, create_agent_app
from cryobox.agentapi.http_fast import FastRoutes, fits
from cryobox.agentapi.http_routes import HOT
from cryobox.agentapi.http_server import HEALTHZ, PREFIX
from cryobox.agentapi.interface import MAX_PTY_INPUT_BYTES
from cryobox.agentapi.operations import Reply, Timeout
from tests.support.fake_agent import FakeAgent

LIFECYCLE = {"close"}
"""Protocol methods that are no operation: they release the transport."""
CUSTOM = {"port_target"}
"""Operations without a generic route (the HTTP client's is hand-written; the app's is http_ports.py)."""


def protocol_methods() -> set[str]:
    return {name for name, member in vars(Agent).items() if inspect.isfunction(member) and not name.startswith("_")}


def test_every_protocol_method_is_an_operation_and_every_operation_a_protocol_method() -> None:
    assert set(OPERATIONS) == protocol_methods() - LIFECYCLE
    assert {name for name, op in OPERATIONS.items() if op.path is None} == CUSTOM
    for name, op in OPERATIONS.items():
        assert op.name == name and op.doc == getattr(Agent, name).__doc__
        assert op.streamed == (not inspect.iscoroutinefunction(getattr(Agent, name))), name


def test_both_transports_implement_every_operation_and_nothing_else() -> None:
    for transport in (InProcessAgent, HttpAgent):
        public = {n for n, m in vars(transport).items() if callable(m) and not n.startswith("_")}
        assert public == set(OPERATIONS) | LIFECYCLE, transport.__name__
        for name, op in OPERATIONS.items():
            method = getattr(transport, name)
            assert method.__name__ == name and inspect.signature(method) == inspect.signature(getattr(Agent, name))
            assert inspect.iscoroutinefunction(method) == (not op.streamed), f"{transport.__name__}.{name}"
    assert isinstance(InProcessAgent(FakeAgent()), Agent)


def test_the_agents_implement_every_operation() -> None:
    for agent in (HostAgent, FakeAgent):
        for name, op in OPERATIONS.items():
            method = getattr(agent, name, None)
            assert method is not None, f"{agent.__name__} lacks {name}"
            kind = inspect.isasyncgenfunction if op.streamed else inspect.iscoroutinefunction
            assert kind(method), f"{agent.__name__}.{name}"


def routes(app: FastAPI) -> list[BaseRoute]:
    """The app's routes, those of included routers too."""
    found: list[BaseRoute] = []
    for route in app.routes:
        included = getattr(route, "original_router", None)  # FastAPI keeps an included router as one route
        found += included.routes if isinstance(included, APIRouter) else [route]
    return found


def plain_routes(app: FastAPI) -> FastRoutes | None:
    """The app's plain routes (:mod:`cryobox.agentapi.http_fast`), as its middleware stack will build them."""
    for middleware in app.user_middleware:
        factory: Any = middleware.cls
        if factory is FastRoutes:
            args: Any = middleware.args
            kwargs: Any = middleware.kwargs
            return FastRoutes(app, *args, **kwargs)
    return None


def test_the_app_serves_every_operation_with_a_route_and_nothing_else() -> None:
    expected = {(op.method, PREFIX + op.path): name for name, op in OPERATIONS.items() if op.path is not None}
    plain = {name for name, op in OPERATIONS.items() if fits(op)}
    assert {"exec", "create", "get", "delete"} <= plain and "exec_stream" not in plain and "write_file" not in plain
    for with_plain in (True, False):
        app = create_agent_app(FakeAgent(), "token", plain_routes=with_plain)
        served = {(m, r.path): r.name for r in routes(app) if isinstance(r, APIRoute) for m in r.methods or ()}
        fastapi = {key: name for key, name in expected.items() if not with_plain or name not in plain}
        assert served == {**fastapi, ("GET", HEALTHZ): "healthz"}
        fast = plain_routes(app)
        assert (fast is not None) == with_plain
        for (method, path), name in expected.items():
            example = re.sub(r"\{[^}]+\}", "x1", path)
            hit = fast.match(method, example) if fast is not None else None
            assert (hit[0].name if hit else None) == (name if with_plain and name in plain else None), (method, path)
    app = create_agent_app(FakeAgent(), "token")
    ports = {r.path for r in routes(app) if isinstance(r, Route | WebSocketRoute) and not isinstance(r, APIRoute)}
    port_route = PREFIX + "/sandboxes/{sandbox_id}/ports/{port}"
    assert ports == {port_route, port_route + "/{path:path}"}  # port_target's far end, written by hand
    for route in routes(app):
        if isinstance(route, APIRoute) and route.name in OPERATIONS:
            op = OPERATIONS[route.name]
            assert route.status_code == (204 if op.reply is Reply.NONE else None), route.name


def test_no_two_operation_routes_match_one_request() -> None:
    """The app matches the hot operations first (``http_routes.HOT``): that changes nothing only while no two
    routes of one method match the same path. Each route's path, its parameters filled in, is matched by its own
    route alone; and the app's routes are its own, not an included router's (FastAPI matches those twice)."""
    app = create_agent_app(FakeAgent(), "token", plain_routes=False)  # every operation a FastAPI route
    api = [r for r in app.routes if isinstance(r, APIRoute)]
    assert {r.name for r in api} >= set(HOT)
    order = [r.name for r in api]
    assert order[1 : 1 + len(HOT)] == list(HOT)  # after healthz
    for route in api:
        example = re.sub(r"\{[^}]+\}", "x1", route.path)
        for method in route.methods or ():
            scope = {"type": "http", "path": example, "method": method}
            full = [r.name for r in api if r.matches(scope)[0] is Match.FULL]
            assert full == [route.name], (method, example, full)


def test_the_table_keeps_the_wire_contract() -> None:
    """Limits and timeouts that are part of the contract, spelled out once more."""
    limits = {name: op.route.max_body for name, op in OPERATIONS.items() if op.route.max_body is not None}
    assert limits == {"write_file": MAX_FILE_BYTES, "evidence_put": MAX_FILE_BYTES, "pty_input": MAX_PTY_INPUT_BYTES}
    assert MAX_FILE_BYTES == 64 << 20 and MAX_PTY_INPUT_BYTES == 1 << 20
    timeouts = {name: op.route.timeout for name, op in OPERATIONS.items() if op.route.timeout is not Timeout.DEFAULT}
    assert {n for n, t in timeouts.items() if t is Timeout.EXEC} == {"exec", "exec_stream"}
    assert {n for n, t in timeouts.items() if t is Timeout.NONE} == {
        n for n, op in OPERATIONS.items() if op.streamed and n != "exec_stream"
    }
    assert {n for n, t in timeouts.items() if t is Timeout.LONG} == {
        "store_volume",
        "fetch_volume",
        "store_hibernation",
        "wake_stored",
        "snapshot",
        "store_snapshot",
        "delete_snapshot",
        "prune_snapshots",
        "fork",
        "fork_tree",
    }
    assert OPERATIONS["wake_stored"].from_body == ("sandbox_id",)
    assert {n: op.route.reply_key for n, op in OPERATIONS.items() if op.route.reply_key} == {
        "prune_snapshots": "removed",
        "evidence_put": "bytes",
    }
