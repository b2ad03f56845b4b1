"""docs/e2b-inventory.md against E2B's vendored contract and the real app: every route of ``spec/openapi.yml``, every
envd RPC of the protos and every envd REST route of ``envd.yaml`` has exactly one row, the counts are the rows', and
each status is what the app does (``served``: routed to a handler of that shape; ``missing``/``n/a``: not)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compat.e2b import api
from cryobox.compat.e2b.envd.filesystem import FilesystemService
from cryobox.compat.e2b.envd.gen.filesystem.filesystem_connect import Filesystem
from cryobox.compat.e2b.envd.gen.process.process_connect import Process
from cryobox.compat.e2b.envd.process import ProcessService
from cryobox.compose.app import create_app
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from tests.support.app import agent, registry
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent

__all__ = ["agent", "registry"]  # fixtures

ROOT = Path(__file__).resolve().parents[4]
E2B = ROOT / "src" / "cryobox" / "compat" / "e2b"
OPENAPI = E2B / "spec" / "openapi.yml"
PROTOS = E2B / "envd" / "proto"
ENVD_REST = PROTOS / "envd.yaml"
DOC = ROOT / "docs" / "e2b-inventory.md"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
KINDS = ("served", "refused", "missing", "n/a")
CONTROL, RPCS, REST = "Control plane", "envd RPCs", "envd REST"
SERVICES: dict[str, tuple[type[Any], type[Any]]] = {
    "process.Process": (ProcessService, Process),
    "filesystem.Filesystem": (FilesystemService, Filesystem),
}
ENVD_NO_ROUTE = re.compile(r"^no route ")


@dataclass(frozen=True)
class Row:
    key: str
    kind: str
    why: str


@dataclass(frozen=True)
class Table:
    rows: list[Row]
    counts: dict[str, int]
    total: int


def spec_routes(path: Path) -> list[str]:
    document = yaml.safe_load(path.read_text())
    return [f"{m.upper()} {p}" for p, ops in document["paths"].items() for m in ops if m.upper() in METHODS]


def proto_rpcs() -> list[str]:
    found = []
    for proto in sorted(PROTOS.rglob("*.proto")):
        text = proto.read_text()
        package = re.search(r"^package\s+([\w.]+)\s*;", text, re.M)
        assert package is not None, proto
        for service, body in re.findall(r"^service\s+(\w+)\s*\{(.*?)^\}", text, re.M | re.S):
            found += [f"/{package.group(1)}.{service}/{rpc}" for rpc in re.findall(r"^\s*rpc\s+(\w+)\s*\(", body, re.M)]
    return found


def status(cell: str) -> tuple[str, str]:
    kind, _, why = (part.strip() for part in cell.partition(":"))
    assert kind in KINDS, f"unknown status {cell!r}"
    if kind in ("refused", "n/a"):
        assert why, f"{kind} without a reason: {cell!r}"
    if kind == "refused":
        assert re.fullmatch(r"[45]\d\d [a-z_]+", why), f"refused must name a status and a code: {cell!r}"
    if kind in ("served", "missing"):
        assert not why, f"{kind} takes no reason in the status: {cell!r}"
    return kind, why


def parse_doc(text: str) -> dict[str, Table]:
    tables: dict[str, Table] = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = next(t for t in (CONTROL, RPCS, REST) if section.startswith(t))
        counts = re.search(
            r"^Counts: (\d+) \w+: (\d+) served, (\d+) refused, (\d+) missing, (\d+) n/a\.$", section, re.M
        )
        assert counts is not None, f"no counts line under {title}"
        numbers = [int(n) for n in counts.groups()]
        rows = []
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
            if not cells or set(cells[0]) <= {"-"} or cells[0] in ("method", "rpc"):
                continue
            key, cell = (cells[0], cells[1]) if title == RPCS else (f"{cells[0]} {cells[1]}", cells[2])
            rows.append(Row(key, *status(cell)))
        tables[title] = Table(rows, dict(zip(KINDS, numbers[1:], strict=True)), numbers[0])
    assert sorted(tables) == sorted((CONTROL, RPCS, REST))
    return tables


@pytest.fixture(scope="module")
def doc() -> dict[str, Table]:
    return parse_doc(DOC.read_text())


def duplicates(keys: list[str]) -> list[str]:
    return sorted(k for k, n in Counter(keys).items() if n > 1)


@pytest.mark.parametrize(
    ("title", "contract"),
    [(CONTROL, lambda: spec_routes(OPENAPI)), (RPCS, proto_rpcs), (REST, lambda: spec_routes(ENVD_REST))],
)
def test_every_route_of_the_contract_has_exactly_one_row(doc: dict[str, Table], title: str, contract: Any) -> None:
    keys: list[str] = contract()
    rows = [r.key for r in doc[title].rows]
    assert keys and duplicates(keys) == []
    assert duplicates(rows) == [], f"listed twice under {title}"
    assert sorted(set(keys) - set(rows)) == [], f"in the contract, not in the inventory ({title})"
    assert sorted(set(rows) - set(keys)) == [], f"in the inventory, not in the contract ({title})"


@pytest.mark.parametrize("title", [CONTROL, RPCS, REST])
def test_the_counts_are_the_rows(doc: dict[str, Table], title: str) -> None:
    table = doc[title]
    assert table.total == len(table.rows)
    assert table.counts == {k: sum(r.kind == k for r in table.rows) for k in KINDS}


def test_the_doc_parser_rejects_what_it_must() -> None:
    good = DOC.read_text()
    for bad in ("| served |", "| refused |", "| refused: nope |", "| n/a |", "| missing: why |", "| maybe |"):
        with pytest.raises(AssertionError):
            parse_doc(good.replace("| served |", bad, 1) if bad != "| served |" else good.replace("Counts: ", "", 1))


def rpc_implemented(key: str) -> bool:
    service, _, rpc = key.strip("/").partition("/")
    implementation, protocol = SERVICES[service]
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()
    assert callable(getattr(protocol, name, None)), f"the generated {service} has no {name}"
    return getattr(implementation, name) is not getattr(protocol, name)


def test_envd_rpc_status_is_what_the_services_implement(doc: dict[str, Table]) -> None:
    wrong = [r.key for r in doc[RPCS].rows if rpc_implemented(r.key) != (r.kind in ("served", "refused"))]
    assert wrong == []


@pytest.fixture
async def app(registry: Registry, agent: FakeAgent) -> AsyncIterator[tuple[FastAPI, str]]:
    control = control_plane(registry, {"a": agent})
    made = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x")
    await control.fleet.heartbeat(await heartbeat_of(agent))
    _, key = registry.create_key(registry.ensure_workspace("alpha").id)
    try:
        yield made, key
    finally:
        await close_control(control)


def concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "p0", template)


def shape(template: str) -> str:
    return re.sub(r"\{[^}:]+(:[^}]+)?\}", "{}", template)


def flat_routes(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes in the order it tries them, included routers opened (FastAPI >= 0.16x keeps an included
    router as one route holding its ``original_router``; the E2B routers carry their ``/e2b`` prefix themselves)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if isinstance(inner, APIRouter):
            yield from flat_routes(inner.routes)
        else:
            yield route


def handler_of(app: FastAPI, method: str, path: str) -> APIRoute | None:
    """The route that takes ``method path`` (the first full match, as Starlette routes), if it is an API route."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    for route in flat_routes(app.router.routes):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route if isinstance(route, APIRoute) else None
    return None


def takes(app: FastAPI, key: str) -> bool:
    """A handler of the spec route's own shape answers it (not the catch-all, not a route of another shape)."""
    method, path = key.split(" ", 1)
    route = handler_of(app, method, "/e2b" + concrete(path))
    return route is not None and route.endpoint is not api.unserved and shape(route.path) == "/e2b" + shape(path)


def test_takes_tells_a_route_from_the_catch_all_and_from_another_shape(app: tuple[FastAPI, str]) -> None:
    endpoints = [getattr(r, "endpoint", None) for r in flat_routes(app[0].router.routes)]
    assert api.unserved in endpoints and api.create_v1 in endpoints
    assert takes(app[0], "GET /sandboxes/{sandboxID}")
    assert not takes(app[0], "GET /teams")  # the catch-all
    assert takes(app[0], "GET /volumes")
    assert takes(app[0], "GET /sandboxes/metrics")  # registered before GET /sandboxes/{sandbox_id}
    assert not takes(app[0], "GET /sandboxes/volumes")  # a literal segment: GET /sandboxes/{sandbox_id} takes it


def test_control_plane_status_is_what_the_app_routes(doc: dict[str, Table], app: tuple[FastAPI, str]) -> None:
    wrong = [
        f"{r.key}: {r.kind}" for r in doc[CONTROL].rows if takes(app[0], r.key) != (r.kind in ("served", "refused"))
    ]
    assert wrong == []


async def test_what_is_not_served_answers_404_in_e2b_shape(doc: dict[str, Table], app: tuple[FastAPI, str]) -> None:
    made, key = app
    answers = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=made), base_url="http://ctl") as client:
        for row in doc[CONTROL].rows:
            if row.kind in ("missing", "n/a"):
                method, path = row.key.split(" ", 1)
                got = await client.request(method, "/e2b" + concrete(path), headers={"X-API-Key": key})
                answers[row.key] = (got.status_code, got.json().get("code"))
    assert answers and set(answers.values()) == {(404, 404)}


async def test_envd_rest_status_is_what_the_sandbox_url_routes(doc: dict[str, Table], app: tuple[FastAPI, str]) -> None:
    """Through the mounted sandbox URL, to a running sandbox with its access token: a route envd serves answers
    (whatever the answer to an empty request is), one it does not is envd's 404 "no route" (or a 405)."""
    made, key = app
    wrong = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=made), base_url="http://ctl") as client:
        created = await client.post("/e2b/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": key})
        assert created.status_code == 201, created.text
        sandbox = created.json()
        headers = {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"]}
        assert (await client.get("/e2b/sandbox/health", headers=headers)).status_code == 204
        for row in doc[REST].rows:
            method, path = row.key.split(" ", 1)
            got = await client.request(method, "/e2b/sandbox" + concrete(path), headers=headers)
            message = str(got.json().get("message", "")) if got.content else ""
            unrouted = (got.status_code == 404 and bool(ENVD_NO_ROUTE.match(message))) or got.status_code == 405
            if unrouted != (row.kind in ("missing", "n/a")):
                wrong.append(f"{row.key}: {row.kind} but answered {got.status_code} {message}")
    assert wrong == []
