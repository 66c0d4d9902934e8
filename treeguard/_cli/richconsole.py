"""rich's console as every command prints through it (imported with rich
only by a command that prints through rich: ``console.console``)."""

from __future__ import annotations

import errno

from rich.console import Console


class PipeSafeConsole(Console):
    """rich's console, except that a reader gone away (``| head``) leaves as
    the ``BrokenPipeError`` it is: rich's own answer, ``SystemExit(1)``, would
    read as model code that called ``sys.exit`` (``failures`` ends the run)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
