"""The ``treeguard diagnose MODULE:ATTR`` command.

Exit codes: 0 no divergence, 1 a divergence located (a stage fails, or a
bundle's NaN located; a bundle or batch that differs from its digests), 3 a
divergence found that vanishes when the program is cut (or a bundle whose
replay stays finite), 2 usage and
unreadable input (a bad ``MODULE:ATTR``, a missing or foreign trace file),
4 the model's own code failed to import, build, or raised ``SystemExit``.

Run it as ``treeguard diagnose ...`` or ``python -m treeguard diagnose ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .._src.display import printable
from .._src.errors import ConfigError
from .console import console
from .failures import Command
from .loader import load_model
from .options import report_dir_option

DEFAULT_REPORT_DIR = "treeguard-diagnosis"


@click.command("diagnose", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
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
@report_dir_option(DEFAULT_REPORT_DIR, "diagnosis.json, diagnosis.md and diagnosis.html")
@click.option(
    "--bundle",
    type=click.Path(path_type=Path),
    help="Replay this flight-recorder bundle on the model and name the equation where "
    "its NaN or Inf was born.",
)
@click.option(
    "--batch",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --bundle: the step's batch (saved with treeguard.save), for a bundle that "
    "kept only its digest; checked against the digest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print diagnosis.json instead of the table.")
@click.pass_context
def diagnose(  # noqa: PLR0917 - click passes each option positionally
    ctx: click.Context,
    target: str,
    record: Path | None,
    against: Path | None,
    stages: str | None,
    report_dir: Path,
    bundle: Path | None,
    batch: Path | None,
    as_json: bool,
) -> None:
    """Localise a divergence on the Model at MODULE:ATTR, stage by stage.

    The stages: data, keys, shapes, forward, loss, grads, update, jit, vmap,
    grad; the ladder stops at the first failing one and goes to leaf and
    equation level there. Exit status 0 no divergence, 1 located, 3 found
    but not reproducible when the program is cut, 2 usage.

    With --bundle DIR, replays a flight-recorder bundle instead: its digests
    are checked, then the step is run op by op and the first equation that
    made a NaN or Inf is named with its source line. Exit status 1 located
    (or a bundle or batch that differs from its digests), 3 not reproduced.
    """

    # The ladder imports JAX: only once the command runs, so --help starts without it.
    from .._src.diagnose import report as report_mod
    from .._src.diagnose.ladder import STAGES
    from .._src.diagnose.ladder import diagnose as run_ladder

    if batch is not None and bundle is None:
        raise ConfigError("--batch goes with --bundle", hint="treeguard diagnose --bundle DIR ...")
    if bundle is not None:
        if record is not None or against is not None or stages is not None:
            raise ConfigError(
                "--bundle replays a recorded step; --record, --against and --stages run the "
                "stage ladder",
                hint="run them apart",
            )
        _replay(ctx, target, bundle, batch, as_json)
        return
    chosen = STAGES
    if stages is not None:
        chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    if record is not None and against is not None:
        raise ConfigError(
            "--record and --against exclude each other",
            hint="record on one machine, compare on another",
        )
    if against is not None and not against.is_file():
        raise ConfigError(f"no trace file at {against}", hint=f"record one with --record {against}")
    model = load_model(target, command="diagnose")
    result = run_ladder(model, record=record, against=against, stages=chosen, name=target)
    report_mod.write(result, report_dir)
    if as_json:
        click.echo(report_mod.to_json(result))
    else:
        report_mod.print_summary(result, console())
    ctx.exit(result.exit_code)


def _replay(
    ctx: click.Context, target: str, bundle: Path, batch: Path | None, as_json: bool
) -> None:
    """``--bundle``: the replay's lines (or JSON), and its exit status."""
    # replaying imports JAX: only once the command runs
    from .._src.diagnose.replay import replay_bundle
    from .._src.recorder import read_bundle

    found = read_bundle(bundle)
    model = load_model(target, command="diagnose")
    result = replay_bundle(found, model, batch=batch)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, sort_keys=True))
    else:
        for line in result.lines():
            click.echo(printable(line))
    ctx.exit(result.exit_code)


if __name__ == "__main__":
    diagnose()
