"""Options that more than one command takes, each written once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .._src.errors import ConfigError


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


_KEYS = "treeguard.store.keys"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    ctx.meta.setdefault(_KEYS, {})[param.name] = value


#: Each key option: its name, the parameter, whether it repeats, and its help.
_KEY_OPTIONS = (
    (
        "--signing-key",
        "signing_key",
        False,
        "An EC private key (mode 0600) that signs every verdict "
        "(default: $TREEGUARD_SIGNING_KEY_FILE).",
    ),
    (
        "--trusted-key",
        "trusted_keys",
        True,
        "An EC public key whose verdicts count (repeatable; default: $TREEGUARD_TRUSTED_KEYS).",
    ),
    (
        "--revoked-key",
        "revoked_keys",
        True,
        "An EC public key whose verdicts no longer count (repeatable; default: "
        "$TREEGUARD_REVOKED_KEYS).",
    ),
)


def key_options(command: Any) -> Any:
    """Adds ``--signing-key``, ``--trusted-key`` and ``--revoked-key`` to a
    command that opens a store; ``given_keys`` returns what was given.

    Args:
      command: the click command (or the function it is made from).

    Returns:
      The command with the three options.

    Example:
      >>> @click.command()
      ... @key_options
      ... def cmd():
      ...     print([str(k) for k in given_keys()["trusted_keys"]])
      >>> from click.testing import CliRunner
      >>> CliRunner().invoke(cmd, ["--trusted-key", "a.pub", "--trusted-key", "b.pub"]).output
      "['a.pub', 'b.pub']\\n"
    """
    for flag, name, repeats, text in reversed(_KEY_OPTIONS):
        command = click.option(
            flag,
            name,
            type=click.Path(path_type=Path),
            multiple=repeats,
            callback=_remember,
            expose_value=False,
            help=text,
        )(command)
    return command


def given_keys() -> dict[str, Any]:
    """The key options of the running command, as ``ArtifactStore``'s
    ``signing_key``, ``trusted_keys`` and ``revoked_keys`` (none given: the
    store reads the environment's keys).

    Returns:
      The keyword arguments.
    """
    keys = click.get_current_context().meta.get(_KEYS, {})
    return {
        "signing_key": keys.get("signing_key"),
        "trusted_keys": keys.get("trusted_keys", ()),
        "revoked_keys": keys.get("revoked_keys", ()),
    }


def like_option(what: str, *, dest: str = "like", required: bool = False) -> Callable[[Any], Any]:
    """``--like``: a spec JSON or a checkpoint, whose contract ``what`` says
    the use of (``ckpt.read_like`` reads either).

    Example:
      >>> @like_option("FILE must match")
      ... def command(like): ...
      >>> command.__click_params__[0].help
      'A spec JSON or checkpoint: the contract FILE must match.'
    """
    return click.option(
        "--like",
        dest,
        type=click.Path(path_type=Path),
        default=None,
        required=required,
        help=f"A spec JSON or checkpoint: the contract {what}.",
    )


#: ``--store``: the store a command works on.
store_option = click.option(
    "--store",
    "store_root",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The store: a directory, or a bucket URL (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX).",
)

#: ``--spec``: a serving spec file.
spec_option = click.option(
    "--spec",
    "spec_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A treeguard.serving/1 JSON spec (default: every batch input, default buckets).",
)
#: ``--input``: a batch input by key path (repeatable).
input_option = click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="PATH",
    help="A batch input a request carries, as its key path (['x']); repeatable.",
)


def serving_spec(model: Any, spec_file: Path | None, inputs: tuple[str, ...]) -> Any:
    """The ``ServingSpec`` the ``--spec`` and ``--input`` options ask for.

    Args:
      model: the ``Model`` served or exported.
      spec_file: the ``--spec`` file, or None.
      inputs: the ``--input`` key paths (none: every batch input).

    Returns:
      The ``ServingSpec``.

    Raises:
      ConfigError: if both options are given.
    """
    # the serving package imports JAX: only once a command that serves runs
    from .._src.serving.spec import ServingSpec

    if spec_file is not None:
        if inputs:
            raise ConfigError("give --spec or --input, not both")
        return ServingSpec.load(spec_file)
    return ServingSpec.from_model(model, inputs=list(inputs) or None)
