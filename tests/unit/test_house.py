"""The house rules, checked on the source tree: the seam between the control plane and the host agents holds in the
import graph, no package imports its way into a cycle, and no hand-written source file outgrows 450 lines.

Imports are read with :mod:`ast` (nothing is imported), every ``import`` and ``from … import`` anywhere in a module
counts (a function-level import is still a dependency), except those under ``if TYPE_CHECKING:`` for the cycle rule
(they never run). See docs/ARCHITECTURE.md, "Seam rules".
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import cryobox

SRC = Path(cryobox.__file__).resolve().parent.parent
PACKAGE = SRC / "cryobox"
MAX_LINES = 450
GENERATED = ("cryobox/compat/e2b/envd/gen/", "cryobox/sdk/_sync/")
"""Generated code (protoc, ``scripts/unasync.py``): the line rule is for hand-written files."""

CONTROL_SIDE = ("server", "console", "mcpserver", "registry", "compat")
AGENT_SIDE = ("agent",)
NEUTRAL = ("agentapi", "objstore", "util", "models", "errors", "proxy", "image", "config", "netpolicy", "guest")
"""Both sides may use these; they use neither side (``guest`` runs inside the VM and imports nothing of cryobox's)."""
CLIENTS = ("sdk", "capture")
"""Clients of the public API (the SDK, failure capture): they speak HTTP, never to either side's objects."""
COMPOSERS = ("compose", "cli", "bench")
"""The only places that may know both sides."""


@dataclass(frozen=True)
class Import:
    source: str
    """The importing module, dotted."""
    target: str
    """The imported module (or package), dotted."""
    line: int
    type_checking: bool


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(modules: dict[str, Path]) -> Iterator[Import]:
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        guarded = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [
                    f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names
                ]
            for target in targets:
                if target == "cryobox" or target.startswith("cryobox."):
                    yield Import(name, target, node.lineno, node.lineno in guarded)


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return list(_imports(_modules()))


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _crossings(imports: list[Import], sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{i.source}:{i.line} imports {i.target}"
        for i in imports
        if _top(i.source) in sources and _top(i.target) in targets
    )


def test_the_control_plane_never_imports_the_agent(imports: list[Import]) -> None:
    """server/, console/, mcpserver/, registry/ and compat/ reach host agents only through cryobox.agentapi."""
    assert _crossings(imports, CONTROL_SIDE, AGENT_SIDE) == []


def test_the_agent_never_imports_the_control_plane(imports: list[Import]) -> None:
    assert _crossings(imports, AGENT_SIDE, CONTROL_SIDE + COMPOSERS) == []


def test_neutral_packages_import_neither_side(imports: list[Import]) -> None:
    assert _crossings(imports, NEUTRAL, CONTROL_SIDE + AGENT_SIDE + COMPOSERS) == []


def test_clients_import_neither_side(imports: list[Import]) -> None:
    assert _crossings(imports, CLIENTS, CONTROL_SIDE + AGENT_SIDE + COMPOSERS) == []


def test_only_composers_are_imported_by_nobody_but_composers(imports: list[Import]) -> None:
    """compose/, cli/ and bench/ put the parts together; no part imports them back."""
    parts = CONTROL_SIDE + AGENT_SIDE + NEUTRAL + CLIENTS
    assert _crossings(imports, parts, COMPOSERS) == []


def test_every_top_level_package_has_a_side() -> None:
    known = set(CONTROL_SIDE + AGENT_SIDE + NEUTRAL + CLIENTS + COMPOSERS) | {"__init__"}
    found = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert found - known == set(), "a new top-level package needs a side in tests/unit/test_house.py"


def _sibling_graphs(imports: list[Import]) -> dict[str, dict[str, set[str]]]:
    """For every package, the graph of its direct children (subpackages and modules) by the imports between
    anything under them (run-time imports only)."""
    graphs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for i in imports:
        if i.type_checking:
            continue
        a, b = i.source.split("."), i.target.split(".")
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        if common >= len(a) or common >= len(b):
            continue  # a package and something inside it
        graphs[".".join(a[:common])][a[common]].add(b[common])
    return graphs


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_package_imports_its_way_into_a_cycle(imports: list[Import]) -> None:
    """At every level of the tree, the children of a package (subpackages and modules) import each other
    without a cycle."""
    cycles = {package: c for package, graph in _sibling_graphs(imports).items() if (c := _cycles(graph))}
    assert cycles == {}


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check itself can fail."""
    made_up = [
        Import("cryobox.server.a", "cryobox.agentapi.b", 1, False),
        Import("cryobox.agentapi.b", "cryobox.server.c", 1, False),
        Import("cryobox.server.c", "cryobox.server.a", 1, False),
        Import("cryobox.x.y", "cryobox.z", 1, True),
        Import("cryobox.z", "cryobox.x", 1, False),
    ]
    graphs = _sibling_graphs(made_up)
    assert _cycles(graphs["cryobox"]) == [["agentapi", "server"]]
    assert _crossings(made_up, ("agentapi",), ("server",)) == ["cryobox.agentapi.b:1 imports cryobox.server.c"]


def test_no_hand_written_source_file_outgrows_the_house_limit() -> None:
    long_files = {
        str(path.relative_to(SRC)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(part in str(path.relative_to(SRC)) for part in GENERATED)
        and (lines := path.read_text().count("\n")) > MAX_LINES
    }
    assert long_files == {}
