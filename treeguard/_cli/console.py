"""The one console every command prints through, and how text from outside
(a file, a model, a client) is made safe to print on it."""

from __future__ import annotations

import errno
import sys

from rich.console import Console
from rich.markup import escape

from .._src.display import printable

#: The width of output that is not a terminal: wide enough that no table
#: column is ever squeezed, so nothing is cut or folded in a pipe or a log.
PIPE_WIDTH = 100_000


class _Console(Console):
    """rich's console, except that a reader gone away (``| head``) leaves as
    the ``BrokenPipeError`` it is: rich's own answer, ``SystemExit(1)``, would
    read as model code that called ``sys.exit`` (``failures`` ends the run)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")


def console(*, stderr: bool = False) -> Console:
    """The console every command prints through.

    On a terminal it wraps at the terminal's width (tables fold long paths
    within their column, never cutting them). Anything else (a pipe, a file,
    a CI log, click's test runner) gets ``PIPE_WIDTH`` columns and no soft
    wrapping, so each row and each key path stays whole on one line.
    """
    stream = sys.stderr if stderr else sys.stdout
    isatty = getattr(stream, "isatty", None)
    width = None if isatty is not None and isatty() else PIPE_WIDTH
    return _Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def shown(text: object) -> str:
    r"""Text from outside (a tensor name, a path, an exception's message) as
    rich markup: control characters (escape sequences, newlines) spelled out
    as Python does and brackets escaped, so it can neither restyle nor
    rewrite the terminal.

    Example:
      >>> print(shown("[red]w\x1b[2J"))
      \[red]w\x1b[2J
    """
    return escape(printable(text))


def report_error(label: str, message: str) -> None:
    """Prints ``label: message`` on stderr; each line of ``message`` with its
    control characters spelled out (its line breaks are its own)."""
    err = console(stderr=True)
    err.print(f"[red]{label}:[/red]", end=" ")
    err.print(printable(message, newlines=True), markup=False)
