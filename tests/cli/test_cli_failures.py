"""Exit statuses come from the error's class, in one place (a private helper, on purpose)."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from subproc import start_python, stop

import treeguard as tg
from treeguard._cli.failures import EXIT_BROKEN_PIPE, Command

ERRORS = [
    (tg.TreeMismatchError([tg.Mismatch("['w']", "shape", (3,), (2,))]), 1, "failed"),
    (tg.IntegrityError("sha256 differs", path="['w']"), 1, "failed"),
    (tg.StoreError("v1 is not verified"), 1, "failed"),
    (tg.FormatError("not JSON", context="a.json"), 2, "error"),
    (tg.NotAStoreError("not a treeguard store", context="/x"), 2, "error"),
    (tg.UnknownVersionError("no version v9"), 2, "error"),
    (tg.ConfigError("no references"), 2, "error"),
    (FileNotFoundError(2, "No such file or directory", "a.json"), 2, "error"),
]


@pytest.mark.parametrize(
    ("error", "code", "label"), ERRORS, ids=[type(e).__name__ for e, _, _ in ERRORS]
)
def test_the_exit_status_is_the_error_class_s(error: Exception, code: int, label: str) -> None:
    @click.command(cls=Command)
    def fails() -> None:
        raise error

    res = CliRunner().invoke(fails, [])
    assert res.exit_code == code
    if isinstance(error, tg.TreeguardError):
        assert code == type(error).exit_code
    assert res.stderr == f"{label}: {error}\n"


def test_a_bug_keeps_its_traceback() -> None:
    @click.command(cls=Command)
    def buggy() -> None:
        raise KeyError("a bug of ours")

    res = CliRunner().invoke(buggy, [])
    assert res.exit_code == 1 and isinstance(res.exception, KeyError)


def test_a_message_s_control_characters_are_spelled_but_its_lines_kept() -> None:
    @click.command(cls=Command)
    def fails() -> None:
        raise tg.FormatError("tensor 'w\x1b[2J' is not ours", hint="re-save it")

    res = CliRunner().invoke(fails, [])
    assert res.stderr == "error: tensor 'w\\x1b[2J' is not ours\nhint: re-save it\n"


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    # `treeguard ckpt inspect FILE | head -n 2`, through a real pipe: the table is
    # larger than the pipe's buffer, so the command is still writing when the
    # reader closes its end.
    ckpt = tmp_path / "wide.safetensors"
    tg.save(ckpt, {f"layer{i:04d}": np.zeros(2, np.float32) for i in range(3000)})
    proc = start_python(
        "from treeguard._cli.main import main; main()", "ckpt", "inspect", str(ckpt)
    )
    assert proc.stdout is not None
    head = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()
    proc.stdout = None  # closed: stop() collects stderr alone
    _, err = stop(proc, timeout=60)
    assert head[0].startswith(str(ckpt)) and head[1].split()[:2] == ["path", "array"]
    assert (proc.returncode, err) == (EXIT_BROKEN_PIPE, "")


def test_a_broken_pipe_that_is_not_the_output_s_is_an_os_error() -> None:
    @click.command(cls=Command)
    def sends() -> None:
        raise BrokenPipeError(32, "Broken pipe")  # a socket's peer went away

    res = CliRunner().invoke(sends, [])
    assert res.exit_code == 2 and res.stderr == "error: [Errno 32] Broken pipe\n"
