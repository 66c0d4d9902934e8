"""A griffe extension: treeguard's ``Example:`` sections render as examples.

treeguard's docstrings head their doctests ``Example:`` (Google style, one
example per function). griffe's Google parser knows only ``Examples:``, and
would render the doctest lines as Markdown, where ``x['w']`` reads as a link.
This renames the heading before a docstring is parsed, so the lines render
as a Python console block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Renames each ``Example:`` section heading to ``Examples:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub(r"\g<indent>Examples:", obj.docstring.value)
