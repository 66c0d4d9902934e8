"""How the package imports itself: no import inside a function that hides a
circle between two treeguard modules, and every other import inside a
function (a heavy or optional library loaded on first use) says why.

The checks read the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import collections
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

import treeguard

# one worker runs the file: the package's modules are parsed once, not once in each worker
pytestmark = pytest.mark.xdist_group("imports")

ROOT = Path(treeguard.__file__).parent
#: The private tree, named on purpose: its layering is what these tests check.
SRC = "treeguard._src"
#: Where the deferred imports of heavy libraries do not say why yet; the circle
#: check covers every module.
UNCOMMENTED_YET = tuple(
    f"treeguard.{name}"
    for name in ("_cli", "_src.bench", "_src.checkpoint", "_src.serving", "_src.store")
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _targets(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The treeguard modules an import statement loads (its packages included)."""
    if isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    else:
        if node.level:
            base = importer if _is_package(importer) else importer.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        named = [source, *(f"{source}.{a.name}" for a in node.names)]
    found = []
    for name in named:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in MODULES:
                found.append(prefix)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported (not under TYPE_CHECKING)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block)


def _deferred(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports inside a function or method, at any depth."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed on first use rather than at import
    (each pytest worker imports this file while collecting)."""
    return {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}


@functools.cache
def _graph() -> dict[str, set[str]]:
    """The treeguard modules each module imports at module level."""
    return {
        name: {t for node in _module_level(tree.body) for t in _targets(node, name)}
        for name, tree in _trees().items()
    }


def _path(start: str, goal: str) -> list[str] | None:
    """The chain of module-level imports from ``start`` to ``goal``, if any."""
    before: dict[str, str | None] = {start: None}
    queue = collections.deque([start])
    while queue:
        here = queue.popleft()
        if here == goal:
            chain = [here]
            while (prev := before[chain[-1]]) is not None:
                chain.append(prev)
            return chain[::-1]
        for nxt in sorted(_graph()[here]):
            if nxt not in before:
                before[nxt] = here
                queue.append(nxt)
    return None


def test_no_import_inside_a_function_hides_a_circle() -> None:
    circles = []
    for importer, tree in _trees().items():
        for node in _deferred(tree):
            for target in _targets(node, importer):
                if target == importer:
                    continue
                back = _path(target, importer)
                if back is not None:
                    circles.append(
                        f"{importer}:{node.lineno} imports {target} in a function, "
                        f"and {' -> '.join(back)} imports it back"
                    )
    assert circles == []


def test_every_other_import_inside_a_function_says_why() -> None:
    silent = []
    for importer, tree in _trees().items():
        if importer.startswith(UNCOMMENTED_YET):
            continue
        lines = MODULES[importer].read_text(encoding="utf-8").splitlines()
        for node in _deferred(tree):
            if _targets(node, importer):
                continue  # a treeguard module: the test above judges it
            here, above = lines[node.lineno - 1], lines[node.lineno - 2]
            if "#" not in here and not above.strip().startswith("#"):
                silent.append(f"{importer}:{node.lineno}: {here.strip()}")
    assert silent == []


def test_the_checks_see_a_hidden_circle() -> None:
    a, b = f"{SRC}.verify.checks", f"{SRC}.verify.performance"
    assert _path(b, a) is None, "performance must not import checks"
    tree = ast.parse("def f():\n    from .checks import CHECKS\n")
    (node,) = _deferred(tree)
    assert isinstance(node, ast.ImportFrom)
    assert a in _targets(node, b)
    assert _path(a, b) == [a, b]  # checks imports performance: a deferred import back is a circle


@pytest.mark.parametrize("package", [f"{SRC}.diagnose", f"{SRC}.verify"])
def test_a_package_has_no_circle_at_module_level(package: str) -> None:
    graph = _graph()
    inside = [m for m in graph if m.startswith(package + ".")]
    for a in inside:
        for b in graph[a] & set(inside):
            assert _path(b, a) is None, f"{a} and {b} import each other"
