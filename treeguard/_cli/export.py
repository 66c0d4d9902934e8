"""The ``treeguard export`` command.

``treeguard export MODULE:ATTR --store STORE VERSION [--spec FILE] [--input PATH]
[--platform NAME]`` exports the model's serving function with ``jax.export``
(the batch axis symbolic), checks it against the live model on the model's
cases at its tolerance, and keeps it beside VERSION in the store. Verify the
version after it (``treeguard store verify STORE VERSION --model MODULE:ATTR``):
its verdict then covers the artifact, and ``treeguard serve --store STORE``
serves it without the model's code.

Exit codes: 0 stored, 1 the export differs from the live model (nothing
stored), 2 a function ``jax.export`` cannot export or unusable input, 4 the
model's own code failed.
"""

from __future__ import annotations

from pathlib import Path

import click

from .._src.display import fmt_bytes
from .._src.errors import ConfigError
from .._src.store.objects import is_url
from .console import console
from .failures import Command
from .loader import load_model
from .options import input_option, serving_spec, spec_option, store_option


@click.command("export", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="MODULE:ATTR")
@click.argument("version")
@store_option
@spec_option
@input_option
@click.option(
    "--platform",
    "platforms",
    multiple=True,
    metavar="NAME",
    help="A platform to export for (cpu, tpu, cuda, rocm); repeatable; default this "
    "machine's, which must be among them.",
)
def export_command(  # noqa: PLR0917 - click passes every option
    target: str,
    version: str,
    store_root: Path,
    spec_file: Path | None,
    inputs: tuple[str, ...],
    platforms: tuple[str, ...],
) -> None:
    """Export MODULE:ATTR's serving function for VERSION's params into the store.

    The export is checked against the live model on its cases first; a
    function that cannot be exported, or whose export differs, stores nothing.
    """
    # jax and jax.export: only once the command runs
    from .._src.export.api import export_version
    from .._src.store import ArtifactStore

    if not is_url(store_root) and not store_root.is_dir():
        raise ConfigError(f"{store_root}: no store there", hint="treeguard store put first")
    model = load_model(target, command="export")
    spec = serving_spec(model, spec_file, inputs)
    store = ArtifactStore(store_root)
    result = export_version(model, store, version, spec=spec, platforms=list(platforms) or None)
    d = result.description
    console().print(
        f"exported {d.model} for {', '.join(d.platforms)} (jax {d.jax}, calling convention "
        f"{d.calling_convention}): {fmt_bytes(result.nbytes)}, checked on "
        f"{len(d.validated)} cases; version {version} keeps it (digest {result.digest[:12]}…). "
        f"Verify it now: treeguard store verify {store_root} {version} --model {target}",
        markup=False,
        soft_wrap=True,
    )


if __name__ == "__main__":  # pragma: no cover
    export_command()
