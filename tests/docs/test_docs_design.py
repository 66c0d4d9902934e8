"""The design page names every package and module of the private packages,
one line each, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "design.md"
#: A list item that names a package (``_src/store/``) or a module (``_src/walk.py``).
ITEM = re.compile(r"^\s*- `(_(?:src|cli)/[\w/]*?(?:\.py|/))`: \S")


def _tree() -> set[str]:
    found = set()
    for top in ("_src", "_cli"):
        for path in (ROOT / "treeguard" / top).rglob("*.py"):
            rel = path.relative_to(ROOT / "treeguard").as_posix()
            if path.name != "__init__.py":
                found.add(rel)
            elif path.parent.name != top:
                found.add(rel.removesuffix("__init__.py"))
    return found


def _listed() -> list[str]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    return [m.group(1) for m in map(ITEM.match, lines) if m]


def test_the_design_page_names_every_package_and_module_once() -> None:
    listed = _listed()
    assert sorted(p for p in set(listed) if listed.count(p) > 1) == []
    tree = _tree()
    missing, gone = sorted(tree - set(listed)), sorted(set(listed) - tree)
    assert (missing, gone) == ([], []), (
        f"docs/explanation/design.md: add a line for each of {missing}, remove {gone}"
    )


def test_the_check_sees_a_missing_line() -> None:
    assert "_src/walk.py" in _tree() and "_src/store/" in _tree()
    assert "_src/__init__.py" not in _tree() and "_src/" not in _tree()
    assert ITEM.match("- `_src/walk.py`: reading a live pytree.")
    assert ITEM.match("    - `_src/store/pointer.py`: `CURRENT.json`.")
    assert not ITEM.match("- `_src/walk.py`:")  # a name without its line
