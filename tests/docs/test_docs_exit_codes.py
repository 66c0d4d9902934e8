"""The docs' table of exit codes is the command line's own, row for row, and
holds every error class's exit code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import treeguard as tg
from treeguard._cli import failures

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "errors.md"
_ROW = re.compile(r"^\| (?P<code>\d+) \| (?P<meaning>.*) \|$")


def documented() -> dict[int, str]:
    """The rows of the page's table of exit codes, in the order written."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Exit codes of the command line", 1)[1].split("\n## ", 1)[0]
    rows = [_ROW.match(line) for line in section.splitlines() if line.startswith("| ")]
    return {int(m.group("code")): m.group("meaning") for m in rows if m is not None}


def test_the_docs_table_is_the_command_line_s() -> None:
    table = documented()
    assert list(table) == sorted(table), "keep the rows in order of their code"
    assert table == failures.EXIT_CODES


def test_every_error_class_s_exit_code_is_in_the_table() -> None:
    public = [
        cls
        for cls in (getattr(tg, name) for name in tg.__all__)
        if inspect.isclass(cls) and issubclass(cls, tg.TreeguardError)
    ]
    assert len(public) > 15
    # and the classes only the command line raises (a model's failing code, Ctrl-C)
    classes, todo = set(public), list(public)
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in classes:
                classes.add(sub)
                todo.append(sub)
    codes = {cls.exit_code for cls in classes}
    verdicts = {failures.PASSED, failures.FAILED, failures.PARTIAL, failures.EXIT_USAGE}
    assert set(failures.EXIT_CODES) == codes | verdicts | {failures.EXIT_BROKEN_PIPE}
