"""Every public name has an entry in the reference pages, and names one thing.

The public names are ``treeguard.__all__`` and the ``__all__`` of each public
subnamespace (``treeguard.verify``, ``treeguard.serving``, ...). An entry is
a mkdocstrings directive ``::: treeguard.NAME`` in a page under
``docs/reference/``; a name re-exported by two namespaces (an error class
both in ``treeguard`` and in ``treeguard.verify``) is covered by an entry for
either spelling, since both are one object.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

import treeguard

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
_DIRECTIVE = re.compile(r"^:::\s+(?P<name>treeguard(?:\.\w+)+)\s*$", re.MULTILINE)


def namespaces() -> list[str]:
    """``treeguard``, each public subpackage that declares ``__all__``, and
    each public module inside one that declares it too (``treeguard.serving.ray``)."""
    found = ["treeguard"]
    for info in pkgutil.iter_modules(treeguard.__path__):
        if info.name.startswith("_") or not info.ispkg:
            continue
        module = importlib.import_module(f"treeguard.{info.name}")
        if hasattr(module, "__all__"):
            found.append(module.__name__)
            for sub in pkgutil.iter_modules(module.__path__):
                if sub.name.startswith("_") or sub.ispkg:
                    continue
                inner = importlib.import_module(f"{module.__name__}.{sub.name}")
                if hasattr(inner, "__all__"):
                    found.append(inner.__name__)
    return found


def public_names() -> list[str]:
    return [
        f"{namespace}.{name}"
        for namespace in namespaces()
        for name in importlib.import_module(namespace).__all__
    ]


def _resolve(dotted: str) -> Any:
    namespace, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(namespace), name)


def entries() -> dict[str, Path]:
    """Each ``::: name`` directive of the reference pages, and its page."""
    found: dict[str, Path] = {}
    for page in sorted(REFERENCE.rglob("*.md")):
        for match in _DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            found.setdefault(match.group("name"), page)
    return found


def test_the_subnamespaces_are_found() -> None:
    assert {
        "treeguard.verify",
        "treeguard.serving",
        "treeguard.bench",
        "treeguard.diagnose",
        "treeguard.serving.ray",
    } <= set(namespaces())


@pytest.mark.parametrize("name", public_names())
def test_a_public_name_has_a_reference_entry(name: str) -> None:
    documented = entries()
    if name in documented:
        return
    target = _resolve(name)
    same = [
        entry
        for entry in documented
        if entry.count(".") >= 1 and _safe_resolve(entry) is target and not _is_value(target)
    ]
    assert same, (
        f"{name} has no entry in docs/reference/: add a line `::: {name}` to the page of its "
        "namespace (the API pages are docs/reference/api/*.md)"
    )


def _safe_resolve(dotted: str) -> Any:
    try:
        return _resolve(dotted)
    except (AttributeError, ImportError):
        return None


def _is_value(obj: Any) -> bool:
    # Identity proves two spellings name one definition only for classes and functions.
    return not (isinstance(obj, type) or callable(obj))


def test_every_entry_names_something_public() -> None:
    public = set(public_names())
    stray = sorted(name for name in entries() if name not in public)
    assert not stray, f"reference entries for names that are not public: {stray}"


# -- one name per thing, one definition per name ------------------------------------------

SRC = ROOT / "treeguard" / "_src"


def _faces() -> dict[str, ast.Module]:
    """Each public namespace's source, parsed."""
    return {
        namespace: ast.parse(Path(importlib.import_module(namespace).__file__ or "").read_text())
        for namespace in namespaces()
    }


def _homes() -> dict[str, set[str]]:
    """Each public name and the modules it comes from: a class's or function's
    ``__module__`` when it names one (an error class shows its face), else
    the module a namespace imports it from."""
    imported: dict[tuple[str, str], str] = {}
    for namespace, tree in _faces().items():
        package = namespace if namespace.count(".") < 2 else namespace.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                for alias in node.names:
                    imported[namespace, alias.asname or alias.name] = base
    homes: dict[str, set[str]] = {}
    for dotted in public_names():
        namespace, _, name = dotted.rpartition(".")
        target = _resolve(dotted)
        module = "" if _is_value(target) else getattr(target, "__module__", "")
        if not module.startswith("treeguard._src."):  # a definition's home, read, not imported
            module = imported[namespace, name]
        homes.setdefault(name, set()).add(module)
    return homes


def _definitions() -> dict[str, list[str]]:
    """Each name a module of ``treeguard/_src`` defines at its top level, and those modules."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                found.setdefault(name, []).append(module)
    return found


def test_a_namespace_exports_each_name_as_it_is_defined() -> None:
    renamed = [
        f"{namespace}: {alias.name} as {alias.asname}"
        for namespace, tree in _faces().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        # a private alias (``faces as _faces``) is no public name
        if alias.asname not in (None, alias.name) and not alias.asname.startswith("_")
    ]
    assert not renamed, f"a public name differs from its definition's: {renamed}"


def test_each_public_class_and_function_has_one_public_name() -> None:
    spellings: dict[int, list[str]] = {}
    for dotted in public_names():
        target = _resolve(dotted)
        if not _is_value(target):
            spellings.setdefault(id(target), []).append(dotted)
    twice = sorted(names for names in spellings.values() if len(names) > 1)
    assert not twice, f"one thing under two public names (keep one): {twice}"


def test_no_private_module_defines_a_public_name_again() -> None:
    homes, definitions = _homes(), _definitions()
    again = sorted(
        f"{name} in {module}"
        for name, home in homes.items()
        for module in definitions.get(name, [])
        # a package that re-exports its submodules' definitions is their one home
        if not any(module == h or module.startswith(h + ".") for h in home)
    )
    assert not again, (
        f"a module defines a public name for something else: {again}; give one of the "
        "two a name of its own"
    )
