"""Reads the fenced code blocks of a Markdown page, and runs them.

The convention every page follows:

- a ```` ```python ```` block executes; a page's Python blocks run in order in
  one namespace, in one fresh temporary working directory per page (which is
  also first on ``sys.path`` while a block runs, as for ``python`` started
  there);
- in a ```` ```console ```` block (or a ``bash``/``sh``/``shell`` block that
  holds ``$ `` lines) each line starting with ``$ `` is run by bash in that
  directory with the venv's ``bin`` first on ``PATH`` and must exit 0, unless
  it ends with ``  # exit N``; the lines after it, up to the next ``$ `` line
  or the block's end, are compared with its combined stdout and stderr, where
  ``...`` matches any text (doctest's ELLIPSIS); no lines means no output;
  a line ending with ``\\`` continues on the next one;
- every other fence (``text``, ``json``, ``toml``, ``yaml``, ``bash`` without
  ``$ ``, ...) is not run;
- a block whose preceding line is ``<!-- docs: skip (REASON) -->`` is skipped
  with that reason; a skip marker without a reason, or one that precedes no
  block, is an error;
- a page holding the line ``<!-- docs: slow -->`` runs all its blocks only
  under ``-m slow`` (for pages whose Python blocks compile whole models).
"""

from __future__ import annotations

import dataclasses
import doctest
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

PYTHON = frozenset({"python", "py", "python3"})
SHELLS = frozenset({"bash", "sh", "shell"})
CONSOLE = "console"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
_SKIP = re.compile(r"^\s*<!--\s*docs:\s*skip\b(?P<rest>.*?)-->\s*$")
_SKIP_REASON = re.compile(r"^\s*\((?P<reason>.*\S.*)\)\s*$")
_SLOW = re.compile(r"^\s*<!--\s*docs:\s*slow\s*-->\s*$", re.MULTILINE)
_EXIT = re.compile(r"\s{2,}#\s*exit\s+(?P<code>\d+)\s*$")

#: The longest one console command may run, in seconds.
COMMAND_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a page.

    Attributes:
      page: the page's path.
      line: the 1-based line of the opening fence.
      lang: the fence's language (its info string's first word, lower case).
      body: the block's text, dedented to the fence's indentation.
      skip: the skip reason, or None when the block is not skipped.
      error: why the block is malformed (a skip without a reason, a skip
        that precedes no block, an unclosed fence), or None.
    """

    page: Path
    line: int
    lang: str
    body: str
    skip: str | None = None
    error: str | None = None

    @property
    def kind(self) -> str:
        """``python``, ``console`` or ``other`` (not run)."""
        if self.lang in PYTHON:
            return "python"
        if self.lang == CONSOLE:
            return "console"
        if self.lang in SHELLS and any(ln.startswith("$ ") for ln in self.body.splitlines()):
            return "console"
        return "other"


def parse(page: Path) -> list[Block]:
    """Every fenced block of ``page``, and every malformed skip marker, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending_skip: tuple[int, str | None, str | None] | None = None  # line, reason, error
    i = 0
    while i < len(lines):
        text = lines[i]
        skip = _SKIP.match(text)
        if skip:
            if pending_skip is not None:
                blocks.append(_orphan(page, pending_skip[0]))
            reason = _SKIP_REASON.match(skip.group("rest"))
            error = None if reason else "a skip marker needs a reason: <!-- docs: skip (REASON) -->"
            pending_skip = (i + 1, reason.group("reason") if reason else None, error)
            i += 1
            continue
        fence = _FENCE.match(text)
        if fence and fence.group("info") is not None:
            start = i
            marker = fence.group("fence")
            indent = len(fence.group("indent"))
            info = fence.group("info").strip()
            lang = info.split()[0].lower().lstrip("{.") if info else ""
            body_lines: list[str] = []
            i += 1
            closed = False
            while i < len(lines):
                stripped = lines[i].strip()
                if stripped.startswith(marker[0] * len(marker)) and set(stripped) <= {marker[0]}:
                    closed = True
                    break
                body_lines.append(
                    lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i]
                )
                i += 1
            error = None if closed else "the fence is never closed"
            skip_reason = None
            if pending_skip is not None:
                skip_reason = pending_skip[1]
                error = error or pending_skip[2]
                pending_skip = None
            body = textwrap.dedent("\n".join(body_lines))
            blocks.append(Block(page, start + 1, lang, body, skip_reason, error))
            i += 1
            continue
        if pending_skip is not None and text.strip():
            blocks.append(_orphan(page, pending_skip[0]))
            pending_skip = None
        i += 1
    if pending_skip is not None:
        blocks.append(_orphan(page, pending_skip[0]))
    return blocks


def _orphan(page: Path, line: int) -> Block:
    return Block(page, line, "", "", None, "a skip marker that precedes no code block")


def is_slow(page: Path) -> bool:
    """Whether the page asks for all its blocks to run only under ``-m slow``."""
    return _SLOW.search(page.read_text(encoding="utf-8")) is not None


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``$ `` line of a console block and the output it must give."""

    line: int
    command: str
    exit_code: int
    expected: str


def commands(block: Block) -> list[Command]:
    """The commands of a console block, each with its expected exit code and output."""
    found: list[Command] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        text = lines[i]
        if not text.startswith("$ "):
            if text.strip():
                raise ValueError(
                    f"{block.page}:{block.line + 1 + i}: output before any `$ ` line: {text!r}"
                )
            i += 1
            continue
        line = block.line + 1 + i
        command = text[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + "\n" + lines[i]
        exit_code = 0
        code = _EXIT.search(command)
        if code:
            exit_code = int(code.group("code"))
            command = command[: code.start()]
        i += 1
        expected: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        found.append(Command(line, command, exit_code, "\n".join(expected)))
    return found


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` reads as ``expected``, ``...`` matching any text."""
    want, got = _normalise(expected), _normalise(actual)
    if not want:
        return not got
    return doctest.OutputChecker().check_output(want + "\n", got + "\n", doctest.ELLIPSIS)


def run_command(command: Command, cwd: Path) -> tuple[int, str]:
    """Runs one console command by bash in ``cwd``; returns its exit code and output."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", "-c", command.command],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout
