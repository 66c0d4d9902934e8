"""Exit statuses come from the error's class, in one place (a private helper, on purpose)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import treeguard as tg
from treeguard._cli.failures import Command

ERRORS = [
    (tg.TreeMismatchError([tg.Mismatch("['w']", "shape", (3,), (2,))]), 1, "failed"),
    (tg.IntegrityError("sha256 differs", path="['w']"), 1, "failed"),
    (tg.StoreError("v1 is not verified"), 1, "failed"),
    (tg.FormatError("not JSON", context="a.json"), 2, "error"),
    (tg.NotAStoreError("not a treeguard store", context="/x"), 2, "error"),
    (tg.UnknownVersionError("no version v9"), 2, "error"),
    (tg.ConfigError("no references"), 2, "error"),
    (tg.ModelCodeError("boom", target="m:model", stage="import", cause="X"), 4, "error"),
    (tg.RunInterruptedError("interrupted"), 130, "error"),
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
