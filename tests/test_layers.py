"""The package's floors: every module imports only from its own unit or from units on lower
floors, and the import graph has no circle.

The order below is the one ``docs/architecture.md`` draws; a new module belongs to the unit
of its package (or, at the top level, to its own name).  Every import counts: at module
level, inside functions, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "ollamatrio"

# Lowest first.  A unit may import any unit on a lower floor, and nothing on its own floor
# but itself.
FLOORS: list[list[str]] = [
    ["_version", "errors", "types", "wire"],  # leaves: import nothing of the project
    ["config", "gguf", "modelfile", "template", "http1"],  # http1: HTTP/1.1 framing, client
    ["log", "devices", "memory", "model_info", "slot_cache"],
    ["runner"],  # the child process: facts and records only
    ["engines", "store", "response_store"],
    ["model_config", "testing"],
    ["scheduler"],
    ["generation"],  # the typed core every dialect shares: lease + stream, load lines
    ["http"],  # transport: no API knowledge
    ["observability"],
    ["api"],  # the dialects, their routes and the app
    ["serve"],
    ["cli", "fleet"],  # the command line; the fleet gateway beside it (both on the server)
    ["__main__"],
]
# The package's own __init__ re-exports the embedding surface lazily (importlib), so it
# stands outside the floors; only its _version import is a real one.
FACADE = "ollamatrio"

RANK = {unit: floor for floor, units in enumerate(FLOORS) for unit in units}


def module_name(path: pathlib.Path) -> str:
    parts = ["ollamatrio", *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def imports_of(module: str, path: pathlib.Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """The project modules ``module`` imports, with the line of each import."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ollamatrio":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "ollamatrio":
                continue
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno


def graph() -> dict[str, dict[str, int]]:
    found = modules()
    known = set(found)
    return {m: dict(imports_of(m, p, known)) for m, p in found.items()}


def test_every_unit_has_a_floor() -> None:
    units = {unit_of(m) for m in modules()} - {FACADE}
    assert units - set(RANK) == set(), "add the new unit to FLOORS (and docs/architecture.md)"
    assert set(RANK) - units == set(), "FLOORS names a unit that no longer exists"


def test_no_import_goes_up_or_sideways() -> None:
    wrong = []
    for module, targets in graph().items():
        unit = unit_of(module)
        for target, line in targets.items():
            other = unit_of(target)
            if other == unit or (module == FACADE and target == "ollamatrio._version"):
                continue
            if other == FACADE or unit == FACADE or RANK[other] >= RANK[unit]:
                wrong.append(f"{module}:{line} imports {target} ({unit} -> {other})")
    assert wrong == []


def test_leaves_import_nothing_of_the_project() -> None:
    g = graph()
    for module in g:
        if unit_of(module) in FLOORS[0]:
            assert g[module] == {}, module


def test_no_import_circle() -> None:
    g = {m: set(targets) for m, targets in graph().items()}
    # A package's __init__ imports its own modules by design; a circle through it is still
    # a circle, so the graph is taken as it is.
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                circles.append([*path[path.index(t) :], t])
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert circles == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ..scheduler import Scheduler", "ollamatrio.scheduler"),
        ("from . import progress", "ollamatrio.api.progress"),
        ("from ollamatrio.types import Chunk", "ollamatrio.types"),
        ("import ollamatrio.store.names", "ollamatrio.store.names"),
    ],
)
def test_imports_are_resolved(tmp_path: pathlib.Path, source: str, expected: str) -> None:
    """The checker itself: relative and absolute forms resolve to the module imported."""
    path = tmp_path / "routes.py"
    path.write_text(source + "\n")
    known = {"ollamatrio.api.progress", "ollamatrio.store.names"}
    assert [t for t, _ in imports_of("ollamatrio.api.routes", path, known)] == [expected]
