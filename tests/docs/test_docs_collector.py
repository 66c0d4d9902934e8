"""The collector of code blocks reads the convention as written, and fails a page that breaks it."""

from __future__ import annotations

from pathlib import Path

from docblocks import commands, is_slow, output_matches, parse, run_command

PAGE = """# A page

```python
x = 1
```

<!-- docs: skip (needs a GPU) -->
```python
raise SystemExit
```

```console
$ echo hi
hi
$ exit 3  # exit 3
$ printf 'a\\nb\\nc\\n'
a
...
```

```bash
ls -l
```

```text
$ not run
```

   ```py
   y = 2
   ```
"""


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return page


def test_each_fence_gets_its_kind_line_and_skip(tmp_path: Path) -> None:
    blocks = parse(_page(tmp_path, PAGE))
    assert [(b.line, b.kind, b.skip, b.error) for b in blocks] == [
        (3, "python", None, None),
        (8, "python", "needs a GPU", None),
        (12, "console", None, None),
        (21, "other", None, None),
        (25, "other", None, None),
        (29, "python", None, None),
    ]
    assert blocks[-1].body == "y = 2"


def test_console_lines_carry_their_exit_code_and_expected_output(tmp_path: Path) -> None:
    console = parse(_page(tmp_path, PAGE))[2]
    found = commands(console)
    assert [(c.line, c.command, c.exit_code, c.expected) for c in found] == [
        (13, "echo hi", 0, "hi"),
        (15, "exit 3", 3, ""),
        (16, "printf 'a\\nb\\nc\\n'", 0, "a\n..."),
    ]
    for command in found:
        code, output = run_command(command, tmp_path)
        assert code == command.exit_code
        assert output_matches(command.expected, output)


def test_a_skip_without_a_reason_is_an_error(tmp_path: Path) -> None:
    blocks = parse(_page(tmp_path, "<!-- docs: skip -->\n```python\nx = 1\n```\n"))
    assert blocks[0].error == "a skip marker needs a reason: <!-- docs: skip (REASON) -->"
    blocks = parse(_page(tmp_path, "<!-- docs: skip () -->\n```python\nx = 1\n```\n"))
    assert blocks[0].error is not None


def test_a_skip_that_precedes_no_block_is_an_error(tmp_path: Path) -> None:
    (block,) = parse(_page(tmp_path, "<!-- docs: skip (why) -->\nSome text.\n"))
    assert block.error == "a skip marker that precedes no code block"


def test_an_unclosed_fence_is_an_error(tmp_path: Path) -> None:
    (block,) = parse(_page(tmp_path, "```python\nx = 1\n"))
    assert block.error == "the fence is never closed"


def test_output_is_compared_with_ellipsis_and_nothing_means_no_output() -> None:
    assert output_matches("ok: ... matches", "ok: 4 tensors, every sha256 matches\n")
    assert not output_matches("ok: ... matches", "error: no such file\n")
    assert output_matches("", "")
    assert not output_matches("", "something\n")
    assert output_matches("a\n...", "a\nb\nc\n")


def test_a_page_asks_to_run_only_under_slow(tmp_path: Path) -> None:
    assert is_slow(_page(tmp_path, "# A\n\n<!-- docs: slow -->\n"))
    assert not is_slow(_page(tmp_path, PAGE))
