"""Options that more than one command takes, each written once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def report_dir_option(default: str, files: str) -> Callable[[Any], Any]:
    """The ``--report-dir`` option of a command that writes a report.

    Args:
      default: the directory used when the option is not given.
      files: the files the command writes there, as the help text names them.

    Returns:
      The click decorator that adds ``--report-dir`` (a ``Path``).

    Example:
      >>> @click.command()
      ... @report_dir_option("out", "a.json")
      ... def cmd(report_dir):
      ...     print(report_dir)
      >>> from click.testing import CliRunner
      >>> CliRunner().invoke(cmd, []).output
      'out\\n'
    """
    return click.option(
        "--report-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=default,
        show_default=True,
        help=f"Where {files} go.",
    )
