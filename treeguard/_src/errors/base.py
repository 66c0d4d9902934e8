"""``TreeguardError``, the base of every exception: a message rendered from
its fields (context, message, hint) with an exit code; and the cap on listed lines."""

from __future__ import annotations

from collections.abc import Sequence

#: How many problems a message lists before it says how many it left out.
LISTED = 20


def cap_lines(lines: Sequence[str], *, limit: int = LISTED, indent: str = "  ") -> list[str]:
    """The first ``limit`` lines, then one line saying how many were left out.

    Example:
      >>> cap_lines(["a", "b", "c"], limit=2)
      ['a', 'b', '  ... and 1 more']
    """
    out = list(lines[:limit])
    if len(lines) > limit:
        out.append(f"{indent}... and {len(lines) - limit} more")
    return out


class TreeguardError(Exception):
    """Base class of every error treeguard raises.

    Args:
      message: what is wrong, naming the key path and both values.
      context: where it happened (a file, a version); printed first.
      hint: the likely fix; printed as a last line ``hint: ...``.

    Attributes:
      message, context, hint: the fields the text is rendered from.
      exit_code: the command line's exit status for this error.
    """

    exit_code = 2

    def __init__(self, message: str = "", *, context: str | None = None, hint: str | None = None):
        self.message = message
        self.context = context
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.context}: {self.message}" if self.context else self.message
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text

    def __str__(self) -> str:
        return self._render()
