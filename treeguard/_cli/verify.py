"""The ``treeguard verify MODULE:ATTR`` command.

Exit codes, as for every treeguard command: 0 when every check passes, 1
when any fails, 2 for usage and configuration errors (a bad ``MODULE:ATTR``,
an attribute that is no ``Model``, missing references without ``--record``,
an unreadable references file).

With ``--no-bench`` every program, the eager reference's operations
included, is compiled for a short compile rather than fast code
(``FAST_COMPILE`` is added to ``XLA_FLAGS``, each flag unless ``XLA_FLAGS``
already sets it): verify runs each program a few times on small batches, so
compile time is nearly all of its time. The benchmark measures the code as
it would run in production, so with it the flags stay as they are.

Run it as ``treeguard verify ...`` or ``python -m treeguard verify ...``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console

if TYPE_CHECKING:
    from .._src.verify.model import Model

DEFAULT_REPORT_DIR = "treeguard-report"
EXIT_USAGE = 2
#: Without LLVM's optimisations, with XLA's older elemental emitters on CPU
#: (they compile a small operation in about two thirds of the time), and
#: with each program's code generated in one piece instead of split across
#: threads.
FAST_COMPILE = {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
    "xla_cpu_parallel_codegen_split_count": "1",
}


def _usage(message: str) -> NoReturn:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {message}")
    sys.exit(EXIT_USAGE)


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


def resolve(target: str) -> Model:
    """Imports ``MODULE:ATTR`` and returns the ``Model`` it names.

    Args:
      target: ``package.module:attribute``; the attribute may be dotted, and
        may be a function of no arguments that returns a ``Model``.

    Returns:
      The model.

    Raises:
      ConfigError: for a malformed target, a module that cannot be imported,
        a missing attribute or something that is no ``Model``.

    Example:
      >>> resolve("treeguard.examples.mlp:model").name
      'treeguard.examples.mlp:model'
      >>> resolve("treeguard.examples.mlp")
      Traceback (most recent call last):
      ...
      treeguard.ConfigError: 'treeguard.examples.mlp' is not MODULE:ATTR...
    """
    from .._src.verify.model import Model

    model: Model = import_target(
        target,
        (Model,),
        what="treeguard.verify.Model",
        command="verify",
        fix="describe the model with treeguard.verify.Model(init=..., apply=..., ...)",
    )
    return model


def import_target(
    target: str, kinds: tuple[type, ...], *, what: str, command: str, fix: str
) -> Any:
    """Imports ``MODULE:ATTR`` and returns the object, which must be one of
    ``kinds`` (or a function of no arguments returning one).

    Args:
      target: ``package.module:attribute``; the attribute may be dotted.
      kinds: the types the object may have.
      what: their public names, for the message (``"treeguard.verify.Model"``).
      command: the command, for the usage hint (``"verify"``).
      fix: the hint for an object of another type.

    Raises:
      ConfigError: for a malformed target, a module that cannot be imported,
        a missing attribute or an object of another type.
    """
    from .._src.errors import ConfigError

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{target!r} is not MODULE:ATTR; hint: treeguard {command} treeguard.examples.mlp:model"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module_name!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = sorted(n for n in dir(module) if isinstance(getattr(module, n, None), kinds))
            hint = f"; the models in {module_name} are {names}" if names else ""
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}{hint}") from None
    if not isinstance(obj, kinds) and callable(obj):
        obj = obj()
    if not isinstance(obj, kinds):
        raise ConfigError(f"{target} is a {type(obj).__name__}, not a {what}", hint=fix)
    return obj


@click.command("verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="MODULE:ATTR")
@click.option(
    "--record", is_flag=True, help="(Re)write the references once every other check passes."
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_REPORT_DIR,
    show_default=True,
    help="Where report.json, report.md and report.html go.",
)
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
def verify(
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
    from .._src.errors import ConfigError, FormatError, IntegrityError, TreeguardError
    from .._src.verify.run import run

    try:
        model = resolve(target)
        report = run(
            model,
            record=record,
            references=references,
            report_dir=report_dir,
            bench=not no_bench,
            name=target,
        )
    except (ConfigError, FormatError, IntegrityError) as e:
        _usage(str(e))
    except TreeguardError as e:
        _usage(f"{type(e).__name__}: {e}")
    except OSError as e:
        _usage(f"cannot write the report to {report_dir}: {e}")
    if as_json:
        click.echo(json.dumps(json.loads(report.to_json()), indent=1))
    else:
        from .console import console

        report.print(console())
    sys.exit(report.exit_code)


if __name__ == "__main__":
    verify()
