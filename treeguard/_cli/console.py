"""The one console every command prints through, and how text from outside
(a file, a model, a client) is made safe to print on it.

rich (tens of milliseconds to import) is imported by the first call that
prints through it, so a command whose output is plain text (``treeguard
spec`` into a pipe or a file: ``plain_stdout``) and every ``--help`` start
without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeAlias

from .._src.display import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.tree import Tree

#: The width of output that is not a terminal: wide enough that no table
#: column is ever squeezed, so nothing is cut or folded in a pipe or a log.
PIPE_WIDTH = 100_000


def console(*, stderr: bool = False) -> Console:
    """The console every command prints through.

    On a terminal it wraps at the terminal's width (tables fold long paths
    within their column, never cutting them). Anything else (a pipe, a file,
    a CI log, click's test runner) gets ``PIPE_WIDTH`` columns and no soft
    wrapping, so each row and each key path stays whole on one line.
    """
    from .richconsole import PipeSafeConsole  # rich: only once something prints through it

    stream = sys.stderr if stderr else sys.stdout
    width = None if _isatty(stream) else PIPE_WIDTH
    return PipeSafeConsole(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def plain_stdout() -> bool:
    """Whether rich would print plain text on stdout: no terminal (nor
    ``FORCE_COLOR`` or ``TTY_COMPATIBLE`` set, which make rich treat a pipe
    as one), so no styles, and a UTF-8 stream, so rich's own box-drawing
    characters. A command may then print its text without rich, byte for
    byte what ``console()`` would print."""
    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower()
    return (
        not _isatty(sys.stdout)
        and encoding.startswith("utf")
        and "FORCE_COLOR" not in os.environ
        and "TTY_COMPATIBLE" not in os.environ
    )


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return isatty is not None and bool(isatty())


#: A line's text in pieces, each with its rich style ("" for none).
Label: TypeAlias = list[tuple[str, str]]


class Branch:
    """One line of a tree ``print_tree`` prints, and the lines below it.

    Its label's pieces are printed as they are (never read as markup): text
    from outside goes through ``printable`` first."""

    __slots__ = ("children", "label")

    def __init__(self, label: Label) -> None:
        self.label, self.children = label, list[Branch]()

    def add(self, label: Label) -> Branch:
        child = Branch(label)
        self.children.append(child)
        return child


def print_tree(tree: Branch) -> None:
    """Prints ``tree`` on stdout as rich's ``Tree`` draws it: through rich
    on a terminal, and without importing rich where it would print plain
    text (``plain_stdout``), byte for byte the same."""
    if not plain_stdout():
        console().print(_rich_tree(tree))
        return
    out = sys.stdout
    out.write("".join(t for t, _ in tree.label) + "\n")
    for line in _plain_lines(tree):
        out.write(line + "\n")
    out.flush()


def _plain_lines(branch: Branch, prefix: str = "") -> Iterator[str]:
    """The lines below ``branch`` as rich's ``Tree`` draws them on a UTF-8
    stream without styles (the guides of ``Tree.TREE_GUIDES[0]``)."""
    last = len(branch.children) - 1
    for i, child in enumerate(branch.children):
        yield prefix + ("└── " if i == last else "├── ") + "".join(t for t, _ in child.label)
        yield from _plain_lines(child, prefix + ("    " if i == last else "│   "))


def _rich_tree(branch: Branch, parent: Tree | None = None) -> Tree:
    """``branch`` as a rich ``Tree``: its labels as ``Text`` (never markup)."""
    from rich.text import Text
    from rich.tree import Tree

    label = Text.assemble(*branch.label)
    tree = Tree(label) if parent is None else parent.add(label)
    for child in branch.children:
        _rich_tree(child, tree)
    return tree


def shown(text: object) -> str:
    r"""Text from outside (a tensor name, a path, an exception's message) as
    rich markup: control characters (escape sequences, newlines) spelled out
    as Python does and brackets escaped, so it can neither restyle nor
    rewrite the terminal.

    Example:
      >>> print(shown("[red]w\x1b[2J"))
      \[red]w\x1b[2J
    """
    from rich.markup import escape  # rich: only for text printed through it

    return escape(printable(text))


def report_error(label: str, message: str) -> None:
    """Prints ``label: message`` on stderr; each line of ``message`` with its
    control characters spelled out (its line breaks are its own)."""
    err = console(stderr=True)
    err.print(f"[red]{label}:[/red]", end=" ")
    err.print(printable(message, newlines=True), markup=False)
