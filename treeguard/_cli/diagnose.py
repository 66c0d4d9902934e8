"""The ``treeguard diagnose MODULE:ATTR`` command.

Exit codes: 0 no divergence, 1 a divergence located (a stage fails), 3 a
divergence found that vanishes when the program is cut, 2 usage and
unreadable input (a bad ``MODULE:ATTR``, a missing or foreign trace file).

Run it as ``treeguard diagnose ...`` or ``python -m treeguard diagnose ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

EXIT_USAGE = 2
DEFAULT_REPORT_DIR = "treeguard-diagnosis"


def _usage(message: str) -> NoReturn:
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[red]error:[/red] {message.replace('[', chr(92) + '[')}"
    )
    sys.exit(EXIT_USAGE)


@click.command("diagnose", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="MODULE:ATTR")
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also save the inputs and every intermediate of one reference step to this trace file.",
)
@click.option(
    "--against",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Compare this machine's step with a recorded trace, equation by equation.",
)
@click.option(
    "--stages",
    default=None,
    help="Comma-separated stages to run (default: all, in ladder order).",
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_REPORT_DIR,
    show_default=True,
    help="Where diagnosis.json, diagnosis.md and diagnosis.html go.",
)
@click.option("--json", "as_json", is_flag=True, help="Print diagnosis.json instead of the table.")
def diagnose(  # noqa: PLR0917 - click passes each option positionally
    target: str,
    record: Path | None,
    against: Path | None,
    stages: str | None,
    report_dir: Path,
    as_json: bool,
) -> None:
    """Localise a divergence on the Model at MODULE:ATTR, stage by stage.

    The stages: data, keys, shapes, forward, loss, grads, update, jit, vmap,
    grad; the ladder stops at the first failing one and goes to leaf and
    equation level there. Exit status 0 no divergence, 1 located, 3 found
    but not reproducible when the program is cut, 2 usage.
    """

    from .._src.diagnose import report as report_mod
    from .._src.diagnose.ladder import STAGES
    from .._src.diagnose.ladder import diagnose as run_ladder
    from .._src.errors import ConfigError, FormatError, IntegrityError, TreeguardError
    from .verify import resolve

    chosen = STAGES
    if stages is not None:
        chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    if record is not None and against is not None:
        _usage(
            "--record and --against exclude each other; record on one machine, compare on another"
        )
    if against is not None and not against.is_file():
        _usage(f"no trace file at {against}; hint: record one with --record {against}")
    try:
        model = resolve(target)
        result = run_ladder(model, record=record, against=against, stages=chosen, name=target)
        report_mod.write(result, report_dir)
    except (ConfigError, FormatError, IntegrityError) as e:
        _usage(str(e))
    except TreeguardError as e:
        _usage(f"{type(e).__name__}: {e}")
    except OSError as e:
        _usage(f"cannot write {e.filename or report_dir}: {e.strerror or e}")
    if as_json:
        click.echo(report_mod.to_json(result))
    else:
        from .console import console

        report_mod.print_summary(result, console())
    sys.exit(result.exit_code)


if __name__ == "__main__":
    diagnose()
