"""The ``treeguard verify MODULE:ATTR`` command.

Exit codes, as for every treeguard command: 0 when every check passes, 1
when any fails, 2 for usage and configuration errors (a bad ``MODULE:ATTR``,
an attribute that is no ``Model``, missing references without ``--record``,
an unreadable references file), 4 when the model's own code fails to import,
its factory raises, or it raises ``SystemExit``.

With ``--no-bench`` every program, the eager reference's operations
included, is compiled for a short compile rather than fast code
(``FAST_COMPILE`` is added to ``XLA_FLAGS``, each flag unless ``XLA_FLAGS``
already sets it): verify runs each program a few times on small batches, so
compile time is nearly all of its time. The benchmark measures the code as
it would run in production, so with it the flags stay as they are.

Run it as ``treeguard verify ...`` or ``python -m treeguard verify ...``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from .console import console
from .failures import Command
from .loader import load_model
from .options import report_dir_option

DEFAULT_REPORT_DIR = "treeguard-report"
#: Without LLVM's optimisations, with XLA's older elemental emitters on CPU
#: (they compile a small operation in about two thirds of the time), and
#: with each program's code generated in one piece instead of split across
#: threads.
FAST_COMPILE = {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
    "xla_cpu_parallel_codegen_split_count": "1",
}


#: The jaxlib release from which XLA no longer knows a flag of
#: ``FAST_COMPILE``. XLA aborts the whole process on a flag it does not know,
#: before any Python can catch it, so a flag is passed only to the releases
#: known to have it (``test_this_xla_accepts_the_fast_compile_flags`` runs
#: the chosen flags under the installed jaxlib).
GONE_IN = {"xla_cpu_use_fusion_emitters": (0, 11)}


def fast_compile_flags(jaxlib_version: str) -> dict[str, str]:
    """The flags of ``FAST_COMPILE`` that the XLA of ``jaxlib_version`` knows.

    Example:
      >>> sorted(fast_compile_flags("0.11.2"))
      ['xla_backend_optimization_level', 'xla_cpu_parallel_codegen_split_count']
      >>> "xla_cpu_use_fusion_emitters" in fast_compile_flags("0.10.2")
      True
    """
    release = tuple(int(p) for p in re.findall(r"\d+", jaxlib_version)[:2])
    return {k: v for k, v in FAST_COMPILE.items() if k not in GONE_IN or release < GONE_IN[k]}


def compile_fast() -> None:
    """Adds each of ``FAST_COMPILE`` that the installed XLA knows to
    ``XLA_FLAGS`` unless that flag is set there; it takes effect if no XLA
    computation has run yet. Reads jaxlib's version without importing it."""
    import importlib.metadata

    flags = os.environ.get("XLA_FLAGS", "")
    wanted = fast_compile_flags(importlib.metadata.version("jaxlib"))
    added = [f"--{k}={v}" for k, v in wanted.items() if k not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()


@click.command("verify", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="MODULE:ATTR")
@click.option(
    "--record", is_flag=True, help="(Re)write the references once every other check passes."
)
@report_dir_option(DEFAULT_REPORT_DIR, "report.json, report.md and report.html")
@click.option(
    "--json", "as_json", is_flag=True, help="Print report.json to stdout instead of the table."
)
@click.option("--no-bench", is_flag=True, help="Skip the short warm benchmark of jit(apply).")
@click.option(
    "--references",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The references file to compare with (or, with --record, to write) instead of the "
    "model's own.",
)
@click.pass_context
def verify(
    ctx: click.Context,
    target: str,
    *,
    record: bool,
    report_dir: Path,
    as_json: bool,
    no_bench: bool,
    references: Path | None,
) -> None:
    """Run the acceptance protocol on the Model at MODULE:ATTR.

    The checks: contract, keys, finite, negative, transforms, environment,
    regression, training, splits. Exit status 0 when all pass, 1 when any
    fails, 2 for usage or configuration errors.
    """
    if no_bench:
        compile_fast()
    from .._src.verify.run import run  # imports JAX, after the XLA flags are set

    model = load_model(target, command="verify")
    report = run(
        model,
        record=record,
        references=references,
        report_dir=report_dir,
        bench=not no_bench,
        name=target,
    )
    if as_json:
        click.echo(json.dumps(json.loads(report.to_json()), indent=1))
    else:
        report.print(console())
    ctx.exit(report.exit_code)


if __name__ == "__main__":
    verify()
