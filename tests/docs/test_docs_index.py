"""The landing page leads: it links every guide, names every extra in its
install line and its table, and its first code block reads without a
horizontal scroll."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from docblocks import parse

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "index.md"
#: The widest line a code block on the landing page may hold.
WIDTH = 80


def _extras() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return sorted(project["optional-dependencies"])


def test_every_guide_is_linked_from_the_landing_page() -> None:
    text = INDEX.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((guides/[\w-]+\.md)(?:#[\w-]+)?\)", text))
    guides = {f"guides/{p.name}" for p in (ROOT / "docs" / "guides").glob("*.md")}
    assert guides - linked == set(), "link each guide from docs/index.md, under its task"


def test_every_extra_is_installed_and_described() -> None:
    text = INDEX.read_text(encoding="utf-8")
    (install,) = re.findall(r"pip install '\.\[([\w,]+)\]'", text)
    rows = set(re.findall(r"^\| `([\w-]+)` \|", text, re.MULTILINE))
    extras = set(_extras())
    assert rows == extras
    # the install line takes every extra that adds a part to the library
    assert set(install.split(",")) == extras - {"dev", "docs", "grpc"}


def test_the_first_code_block_needs_no_horizontal_scroll() -> None:
    first = next(b for b in parse(INDEX) if b.lang == "python")
    widest = max(first.body.splitlines(), key=len)
    assert len(widest) <= WIDTH, widest
