"""The one place an exception becomes an exit status and a message.

The exit status comes from the exception's class (``TreeguardError.exit_code``,
as click's ``ClickException.exit_code``); no command chooses another or edits
an error's text. Every command of the CLI is a ``Command`` (every group a
``Group``), whose ``invoke`` turns:

- a ``TreeguardError`` into its message and its class's exit code;
- an ``OSError`` (a file that cannot be read or written) into exit 2;
- a ``SystemExit`` raised while the command ran into ``ModelExitError``
  (exit 4): the command itself never calls ``sys.exit``, so it came from
  model code (``sys.exit(0)`` in a helper, argparse at import), and a run
  that did not finish must not exit 0;
- a ``KeyboardInterrupt`` into ``RunInterruptedError`` (exit 130);
- a ``BrokenPipeError`` on the output (its reader went away: ``| head``)
  into a quiet exit 141, with nothing more printed, as a shell reports a
  program that SIGPIPE ended; a broken pipe elsewhere (a socket) is an
  ``OSError`` like any other.

A command ends with ``ctx.exit(code)`` for a verdict it computed (a report's
exit code), never ``sys.exit``.
"""

from __future__ import annotations

import os
import select
import sys
from typing import IO, Any

import click

from .._src.errors import ModelCodeError, ModelExitError, RunInterruptedError, TreeguardError
from .console import report_error

#: The exit statuses of a verdict a command reached (a report's exit code is
#: one of them): the check passed, it failed, or it could be made only in part
#: (a file without hashes, a divergence that vanishes when the program is cut).
PASSED, FAILED, PARTIAL = 0, 1, 3
#: The exit status of input that cannot be used (click's own usage errors too).
EXIT_USAGE = 2
#: The exit status when the output's reader went away (``| head``): 128 +
#: SIGPIPE, what a shell reports for coreutils' programs in the same place.
EXIT_BROKEN_PIPE = 141

#: Every exit status of the command line and what it means. The docs' table
#: of exit codes (docs/reference/errors.md) is this table, row for row (a
#: test checks it), and it holds every error class's ``exit_code``.
EXIT_CODES: dict[int, str] = {
    PASSED: "the inputs match, the check passes, the command did what it was asked",
    FAILED: "a check ran and failed: a difference, a failed verify check, a located "
    "divergence, a regression, a store refusal",
    EXIT_USAGE: "usage: a bad option or `MODULE:ATTR`, input that cannot be read, an unknown "
    "version, a missing optional library",
    PARTIAL: "a check made only in part: `ckpt verify` on a foreign file (structure only: "
    "nothing was found wrong, and nothing proves the bytes), `diagnose` when a divergence "
    "vanishes when the program is cut",
    ModelCodeError.exit_code: "the model's own code failed: its module's import or its "
    "factory raised, or it called `sys.exit()` (`ModelCodeError`, `ModelExitError`)",
    RunInterruptedError.exit_code: "interrupted (Ctrl-C): nothing was concluded",
    EXIT_BROKEN_PIPE: "the output's reader went away (a pipe into `head`): the command "
    "stopped quietly",
}


class Failure(click.ClickException):
    """A treeguard error or an ``OSError`` on its way out of a command.

    Attributes:
      error: the exception.
      exit_code: its class's exit code (2 for an ``OSError``).
    """

    def __init__(self, error: TreeguardError | OSError) -> None:
        super().__init__(str(error))
        self.error = error
        # click declares exit_code on the class; a Failure carries its error's class's code.
        self.exit_code = (  # type: ignore[misc]
            error.exit_code if isinstance(error, TreeguardError) else EXIT_USAGE
        )

    def show(self, file: IO[Any] | None = None) -> None:
        label = "failed" if self.exit_code == FAILED else "error"
        report_error(label, self.message)


def failure(error: BaseException, command: str) -> Failure | None:
    """The ``Failure`` for ``error`` raised while ``command`` ran, or None
    for an exception that is a bug of treeguard's (left to show its traceback).

    Example:
      >>> failure(SystemExit(0), "verify").exit_code
      4
      >>> failure(KeyError("x"), "verify") is None
      True
    """
    if isinstance(error, TreeguardError | OSError):
        return Failure(error)
    if isinstance(error, SystemExit):
        return Failure(
            ModelExitError(
                f"SystemExit({error.code!r}) was raised while `treeguard {command}` ran: "
                "model code called sys.exit() or raised SystemExit, so the run did not finish",
                target="",
                stage="run",
                code=error.code,
                hint="a model's functions return or raise an exception; look for sys.exit() "
                "in a helper's error path or an argparse parse at import",
            )
        )
    if isinstance(error, KeyboardInterrupt):
        return Failure(
            RunInterruptedError(
                f"`treeguard {command}` was interrupted (KeyboardInterrupt); nothing was concluded",
                hint="run it again; model code that raises KeyboardInterrupt is treated "
                "the same way",
            )
        )
    return None


def _output_closed() -> bool:
    """Whether stdout or stderr is a pipe whose reader has gone away (where
    ``poll`` cannot tell, as on Windows, a broken pipe is taken for the
    output's, as Python's docs do)."""
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return True
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a file: click's test runner
            continue
        poll = select.poll()
        poll.register(fd, 0)  # POLLERR and POLLHUP are always reported
        if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0)):
            return True
    return False


def _stop_writing() -> None:
    """Points stdout at /dev/null, so the interpreter's last flush of what
    is still buffered does not raise again (the recipe of Python's docs,
    "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # pragma: no cover - stdout is no file
        pass
    finally:
        os.close(devnull)


class Command(click.Command):
    """A command whose failures leave through ``failure``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError as e:
            if not _output_closed():
                raise Failure(e) from e  # a socket's, not ours: an OSError like any other
            _stop_writing()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
        except (TreeguardError, OSError, SystemExit, KeyboardInterrupt) as e:
            words = ctx.command_path.split()
            out = failure(e, " ".join(words[1:]) or ctx.command_path)
            if out is None:  # pragma: no cover - the four kinds above all map
                raise
            raise out from e


class Group(click.Group):
    """A group whose commands (and subgroups) are ``Command``s (and ``Group``s)."""

    command_class = Command
    group_class = type
