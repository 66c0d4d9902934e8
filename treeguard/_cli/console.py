"""The one console every command prints through."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

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
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    isatty = getattr(stream, "isatty", None)
    width = None if isatty is not None and isatty() else PIPE_WIDTH
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)
