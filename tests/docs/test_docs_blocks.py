"""Every code block of README.md and of docs/**/*.md runs as written.

One test per block, named ``page:line``. The convention is in
``docblocks.py``. A page's blocks depend on the blocks before them, so a test
first runs (once) each earlier block of its page that has not run yet.
Console blocks start processes (2 to 4 s each for ``treeguard``), so they,
every block after the first console block of a page, and every block of a
page marked ``<!-- docs: slow -->`` run with ``-m slow``.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docblocks import Block, commands, is_slow, output_matches, parse, run_command

ROOT = Path(__file__).resolve().parents[2]


def pages() -> list[Path]:
    """README.md, then every docs page in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _runnable(block: Block) -> bool:
    return block.kind != "other" or block.skip is not None or block.error is not None


def _collect() -> list[Any]:
    params = []
    for page in pages():
        slow = is_slow(page)
        for index, block in enumerate(parse(page)):
            if not _runnable(block):
                continue
            slow = slow or (block.kind == "console" and block.skip is None)
            name = f"{page.relative_to(ROOT)}:{block.line}"
            # A page's blocks share a namespace: one worker runs them in order
            # (another would run the earlier blocks again to get there).
            marks = [pytest.mark.xdist_group(str(page.relative_to(ROOT)))]
            marks += [pytest.mark.slow] if slow else []
            params.append(pytest.param(page, index, id=name, marks=marks))
    return params


@dataclasses.dataclass
class _Page:
    """What a page's blocks share: a working directory and a namespace."""

    cwd: Path
    module: types.ModuleType
    blocks: list[Block]
    done: int = 0  # blocks[:done] have run (or were skipped)
    failed: int | None = None  # the index of the first block that failed

    def where(self, index: int) -> str:
        return f"{self.blocks[index].page.relative_to(ROOT)}:{self.blocks[index].line}"


class _Pages:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.state: dict[Path, _Page] = {}

    def get(self, page: Path) -> _Page:
        if page not in self.state:
            cwd = Path(tempfile.mkdtemp(prefix=page.stem + "-", dir=self.base))
            name = f"docs_page_{len(self.state)}"
            module = types.ModuleType(name)
            module.__file__ = str(cwd / f"{page.stem}.py")
            sys.modules[name] = module  # dataclasses and pickling look a module up by name
            self.state[page] = _Page(cwd, module, parse(page))
        return self.state[page]


@pytest.fixture(scope="session")
def _pages() -> Iterator[_Pages]:
    base = Path(tempfile.mkdtemp(prefix="treeguard-docs-"))
    state = _Pages(base)
    yield state
    for page in state.state.values():
        sys.modules.pop(page.module.__name__, None)
    shutil.rmtree(base, ignore_errors=True)


def _run_python(block: Block, page: _Page) -> None:
    filename = str(block.page)
    linecache.checkcache(filename)
    code = compile("\n" * block.line + block.body + "\n", filename, "exec")
    old_cwd = Path.cwd()
    sys.path.insert(0, str(page.cwd))
    os.chdir(page.cwd)
    try:
        exec(code, page.module.__dict__)
    finally:
        os.chdir(old_cwd)
        sys.path.remove(str(page.cwd))


def _run_console(block: Block, page: _Page) -> None:
    for command in commands(block):
        code, output = run_command(command, page.cwd)
        where = f"{block.page.relative_to(ROOT)}:{command.line}"
        if code != command.exit_code:
            raise AssertionError(
                f"{where}: `{command.command}` exited {code}, expected {command.exit_code}; "
                f"its output:\n{output}"
            )
        if not output_matches(command.expected, output):
            raise AssertionError(
                f"{where}: `{command.command}` printed\n{output}\nexpected\n{command.expected}"
            )


def _run(block: Block, page: _Page) -> None:
    if block.error is not None:
        raise AssertionError(f"{block.page.relative_to(ROOT)}:{block.line}: {block.error}")
    if block.skip is not None or block.kind == "other":
        return
    if block.kind == "python":
        _run_python(block, page)
    else:
        _run_console(block, page)


@pytest.mark.parametrize(("page_path", "index"), _collect())
def test_block_runs(page_path: Path, index: int, _pages: _Pages) -> None:
    page = _pages.get(page_path)
    while page.done <= index:
        current = page.done
        block = page.blocks[current]
        page.done += 1
        if page.failed is not None:
            pytest.fail(f"an earlier block of this page failed: {page.where(page.failed)}")
        if current == index and block.skip is not None and block.error is None:
            pytest.skip(block.skip)
        try:
            _run(block, page)
        except BaseException:
            page.failed = current
            raise
    # Otherwise this block already ran, in order, before a later block of its page.
    if page.failed is not None and page.failed <= index:
        pytest.fail(f"this block or an earlier one failed: {page.where(page.failed)}")
