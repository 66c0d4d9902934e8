"""Every public name has an entry in the reference pages.

The public names are ``treeguard.__all__`` and the ``__all__`` of each public
subnamespace (``treeguard.verify``, ``treeguard.serving``, ...). An entry is
a mkdocstrings directive ``::: treeguard.NAME`` in a page under
``docs/reference/``; a name re-exported by two namespaces (an error class
both in ``treeguard`` and in ``treeguard.verify``) is covered by an entry for
either spelling, since both are one object.
"""

from __future__ import annotations

import importlib
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
