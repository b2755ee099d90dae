"""The packages of ``app`` stand on each other in one order: a module imports from its own package and
the packages below it, never from one above it or from a peer beside it (the layers of ``app/__init__``).
Every import counts, also those inside functions and under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"

# Bottom to top; the packages in one row are peers, and peers import nothing of each other.
LAYERS: list[tuple[str, ...]] = [
    ("app", "app.settings", "app.errors"),  # the package root holds only the version
    ("app.telemetry",),
    ("app.model",),
    ("app.engine", "app.cache"),
    ("app.tasks",),
    ("app.api",),  # what both protocols share: schemas, the error table, keys, drain, encodings
    ("app.api.http", "app.api.rpc"),
    ("app.serving", "app.bulk"),  # how processes start: the service, and the bulk job beside it
    ("app.__main__", "app.cli"),  # python -m app; the zhembed console script
]
RANK = {group: rank for rank, row in enumerate(LAYERS) for group in row}


def group_of(module: str) -> str:
    """The layer group ``module`` belongs to: the longest group name that is it or a package above it."""
    best = "app"
    for group in RANK:
        if (module == group or module.startswith(group + ".")) and len(group) > len(best):
            best = group
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """The ``app`` modules a file imports (``from app import x`` names ``app.x`` where x is a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "app")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "app":
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                as_path = ROOT / candidate.replace(".", "/")
                is_module = as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists()
                names.add(candidate if is_module else node.module)
    return names


SOURCES = sorted(p for p in APP.rglob("*.py") if "_pb2" not in p.name)


def test_every_group_exists() -> None:
    for group in RANK:
        path = ROOT / group.replace(".", "/")
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), group


def test_every_module_has_a_layer() -> None:
    assert all(group_of(module_name(p)) in RANK for p in SOURCES)


def violations(module: str, path: Path) -> list[str]:
    """The imports of ``path`` (as ``module``) that point up or sideways."""
    mine = group_of(module)
    wrong = []
    for target in sorted(imported(path)):
        theirs = group_of(target)
        if theirs == mine or RANK[theirs] < RANK[mine]:
            continue
        where = "above" if RANK[theirs] > RANK[mine] else "beside"
        wrong.append(f"{target} ({theirs}, {where} {mine})")
    return wrong


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_point_down(path: Path) -> None:
    module = module_name(path)
    wrong = violations(module, path)
    assert not wrong, f"{module} imports: " + "; ".join(wrong)


def test_the_check_sees_upward_and_sideways_imports(tmp_path: Path) -> None:
    """The rule itself: a task importing the HTTP routes (in a function), the engine the cache, gRPC
    the HTTP routes, and the engine a task under TYPE_CHECKING are all caught; importing below is not."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from app.errors import ServiceError\n"
        "from app.model import dense\n"
        "def f():\n    from app.api.http.routes import router\n"
        "if TYPE_CHECKING:\n    from app.tasks.service import Service\n"
        "import app.cache.vectors\n"
    )
    assert violations("app.engine.probe", source) == [
        "app.api.http.routes (app.api.http, above app.engine)",
        "app.cache.vectors (app.cache, beside app.engine)",
        "app.tasks.service (app.tasks, above app.engine)",
    ]
    assert violations("app.api.rpc.probe", source) == [
        "app.api.http.routes (app.api.http, beside app.api.rpc)"
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module → the modules it imports): each strongly connected set of
    more than one module, or a module that imports itself, sorted. A package's ``__init__`` and the
    modules inside it are left out of each other's imports: the package and its parts are one place."""

    def own(module: str, target: str) -> bool:
        return target.startswith(module + ".") or module.startswith(target + ".")

    edges = {m: sorted(t for t in ts if t in graph and not own(m, t)) for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1 or module in edges[module]:
                found.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_import_circle() -> None:
    graph = {module_name(p): imported(p) for p in SOURCES}
    assert cycles(graph) == []


def test_the_check_sees_an_import_circle() -> None:
    """Two modules importing each other (under TYPE_CHECKING too: ``imported`` reads every import) and a
    longer ring are found; a package's ``__init__`` importing its own modules is not a circle."""
    graph = {
        "app.engine": {"app.engine.a"},
        "app.engine.a": {"app.engine.b", "app.engine"},
        "app.engine.b": {"app.engine.a"},
        "app.tasks.x": {"app.tasks.y"},
        "app.tasks.y": {"app.tasks.z"},
        "app.tasks.z": {"app.tasks.x", "app.errors"},
    }
    assert cycles(graph) == [
        ["app.engine.a", "app.engine.b"],
        ["app.tasks.x", "app.tasks.y", "app.tasks.z"],
    ]
