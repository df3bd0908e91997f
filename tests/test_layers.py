"""The package's floors: every module imports only from its own unit or from units on lower
floors, and the import graph has no circle; and no module reaches into another's private
members (``obj._name``).

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
    # leaves: import nothing of the project
    ["_version", "errors", "gofmt", "kv_cache", "speculative", "types", "wire"],
    ["config", "gguf", "modelfile", "template", "http1", "auth"],  # http1: HTTP/1.1 framing
    ["log", "devices", "memory", "model_info", "slot_cache", "convert"],
    ["runner"],  # the child process: facts and records only
    ["engines", "store"],
    ["model_config", "testing"],
    ["scheduler"],
    ["generation"],  # the typed core every dialect shares: lease + stream, load lines
    ["http", "console"],  # transport: no API knowledge; the console's files
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


DIALECTS = ("native", "openai", "anthropic", "responses")
# The Responses API is OpenAI's: its dialect reads OpenAI's wire helpers (error objects,
# SSE events), and nothing else of another dialect.
DIALECT_READS = {("responses", "ollamatrio.api.openai.wire")}


def dialect_of_module(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "api" and parts[2] in DIALECTS:
        return parts[2]
    return None


def test_a_dialect_imports_no_other_dialect() -> None:
    """Each dialect package (api/native/, api/openai/, ...) builds on the shared modules of
    api/ and below, never on another dialect."""
    wrong = []
    for module, targets in graph().items():
        dialect = dialect_of_module(module)
        if dialect is None:
            continue
        for target, line in targets.items():
            other = dialect_of_module(target)
            if other not in (None, dialect) and (dialect, target) not in DIALECT_READS:
                wrong.append(f"{module}:{line} imports {target}")
    assert wrong == []


# -- private members stay in their module ----------------------------------------------------

# Private members of other code that a module may use, each for its reason (module -> names).
FOREIGN_PRIVATES: dict[str, set[str]] = {
    # Hypercorn's HTTP/1.1 protocol has no public hook to refuse h2c upgrades.
    "http/hypercorn_bridge.py": {"_check_protocol", "_send_error_response"},
    # The marker this module sets on the logging handlers it installs.
    "log.py": {"_ollamatrio"},
    # A namedtuple's documented API (prometheus_client's Sample).
    "observability/metrics.py": {"_replace"},
    # os._exit: leave at once, without llama.cpp's teardown or Python's.
    "runner/__main__.py": {"_exit"},
    "runner/probe.py": {"_exit"},
}


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).split("[")[0].endswith("Protocol") for base in node.bases)


def _defined_here(tree: ast.Module) -> set[str]:
    """The names a module defines: functions, classes and class attributes, and what it
    assigns on ``self`` or ``cls``.  A protocol's members only say what another module
    defines, so they do not count."""
    stubs = {
        id(item)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and _is_protocol(node)
        for item in node.body
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        if isinstance(node, definition) and id(node) not in stubs:
            names.add(node.name)
        if isinstance(node, ast.ClassDef) and not _is_protocol(node):
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else []
                if isinstance(item, ast.AnnAssign):
                    targets = [item.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return names


def _is_own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own members."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and ast.unparse(value.func) == "super"


def foreign_private_uses(
    source: str, allowed: set[str] | frozenset[str] = frozenset()
) -> list[tuple[int, str]]:
    """``(line, "obj._name")`` for each use of a private member that the module neither
    defines nor is allowed (single underscore, on an object other than its own)."""
    tree = ast.parse(source)
    defined = _defined_here(tree) | allowed
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not _is_own(node.value)
            and node.attr not in defined
        ):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_private_member_is_used_outside_its_module() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        allowed = FOREIGN_PRIVATES.get(relative, set())
        for line, use in foreign_private_uses(path.read_text(), allowed):
            wrong.append(f"ollamatrio/{relative}:{line} {use}")
    assert wrong == []


def test_every_allowed_private_is_still_used() -> None:
    """An allowance whose use is gone is removed with it."""
    unused = []
    for relative, names in FOREIGN_PRIVATES.items():
        used = {
            use.rpartition(".")[2]
            for _, use in foreign_private_uses((PACKAGE / relative).read_text())
        }
        unused += [f"{relative}: {name}" for name in sorted(names - used)]
    assert unused == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(engine):\n    return engine._gone()\n", [(2, "engine._gone")]),
        ("x = a.b._c\n", [(1, "a.b._c")]),
        ("h = object()\nh._mark = 1\n", [(2, "h._mark")]),  # set on another object
        (
            "class P(Protocol):\n    def _hook(self): ...\ndef f(p):\n    p._hook()\n",
            [(4, "p._hook")],  # a protocol only declares it
        ),
        ("class C:\n    def _hook(self): ...\ndef f(c):\n    c._hook()\n", []),
        ("class C:\n    def __init__(self):\n        self._n = 0\ndef f(c):\n    c._n\n", []),
        ("class C:\n    _k = 1\nC._k\n", []),
        ("class C(B):\n    def f(self):\n        super()._g()\n        self._h\n", []),
        ("x.__dict__\n", []),
    ],
)
def test_private_uses_are_found(source: str, expected: list[tuple[int, str]]) -> None:
    """The checker itself: another object's private member is found unless this module
    defines it (a protocol's declaration does not count)."""
    assert foreign_private_uses(source) == expected
