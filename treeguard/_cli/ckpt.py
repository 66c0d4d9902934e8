"""The ``treeguard ckpt`` command group.

Exit codes, as for every treeguard command: 0 when the check passes, 1 when
it fails (a corrupt tensor, a contract mismatch, a refused promotion), 2 for
usage errors and unreadable input. ``ckpt verify`` exits 3 on a safetensors
file treeguard did not write: its structure was checked, and it holds no
hashes or contract to check its bytes against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .._src.atomic import fsync_dir, temp_path
from .._src.checkpoint import (
    Header,
    load,
    read_header,
    spec_from_file,
    verify_file,
)
from .._src.checkpoint.restore import plain_leaves
from .._src.checkpoint.select import select
from .._src.checkpoint.write import write_checkpoint
from .._src.display import fmt_bytes, printable
from .._src.errors import ConfigError, TreeMismatchError
from .._src.paths import parse
from .._src.spec import TreeSpec
from .._src.surgery import METADATA_KEY as SURGERY_KEY
from .._src.surgery import Surgery
from .console import console, shown
from .failures import Group
from .importing import foreign_or_none, inspect_foreign, verify_foreign
from .loader import load_target
from .options import like_option

#: Files smaller than this verify too fast for a progress bar to help.
_PROGRESS_MIN_BYTES = 64 * 1024 * 1024


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for long work; nothing for short work or a pipe."""
    err = console(stderr=True)
    if total < _PROGRESS_MIN_BYTES or not err.is_terminal:
        yield None
        return
    with Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, _total: int) -> None:
            bar.update(task, completed=done)

        yield update


def _header_json(h: Header) -> dict[str, Any]:
    return {
        "file": h.path,
        "format": h.format,
        "num_leaves": h.spec.num_leaves,
        "num_params": h.spec.num_params,
        "nbytes": h.spec.nbytes,
        "file_bytes": h.file_bytes,
        "hash": h.hash_name,
        "tensors": [
            {
                "path": t.name,
                "dtype": t.dtype.name,
                "shape": list(t.shape),
                "params": t.size,
                "nbytes": t.nbytes,
                "stored_as": t.stored_dtype,
                "data_offsets": [t.begin, t.end],
                h.hash_name: t.digest,
            }
            for t in h.tensors
        ],
        "env": h.env,
        "metadata": h.metadata,
        "spec": json.loads(h.spec.to_json()),
    }


@click.group("ckpt", cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def ckpt() -> None:
    """Inspect and verify checkpoint files."""


@ckpt.command("inspect")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the header as JSON.")
@click.option(
    "--subtree",
    metavar="PATH",
    default=None,
    help="List only the part below this key path, e.g. \"['encoder']\" (what "
    "`load(..., subtree=PATH)` reads).",
)
def inspect_command(file: Path, as_json: bool, subtree: str | None) -> None:
    """Print FILE's tree, shapes, dtypes, sizes, environment and metadata.

    Reads the header only, never the array data. FILE may also be a sharded
    checkpoint directory: then its spec, shardings and sizes per process.
    """
    if file.is_dir() and subtree is None:
        _sharded(file, as_json=as_json)
        return
    foreign = foreign_or_none(file) if not file.is_dir() else None
    if foreign is not None and subtree is None:  # another tool's file: its tensors, what it lacks
        inspect_foreign(foreign, as_json=as_json)
        return
    h = read_header(file) if subtree is None else _part(file, subtree, foreign is None)
    if as_json:
        click.echo(json.dumps(_header_json(h), indent=1, ensure_ascii=False))
        return
    out = console()
    params = h.spec.num_params
    out.print(
        f"[bold]{shown(file)}[/bold]  {h.format}  {h.spec.num_leaves} tensors  "
        f"{params:,} params  {fmt_bytes(h.spec.nbytes)} of data  {fmt_bytes(h.file_bytes)} file"
    )
    table = Table(box=None, pad_edge=False, show_edge=False)
    for col, justify in (
        ("path", "left"),
        ("array", "left"),
        ("params", "right"),
        ("bytes", "right"),
        (h.hash_name, "left"),
    ):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for t in h.tensors:
        table.add_row(
            shown(t.name) or "<root>",
            t.summary(),
            f"{t.size:,}",
            fmt_bytes(t.nbytes),
            t.digest[:16],
        )
    out.print(table)
    env = Table(title="environment", box=None, show_header=False, title_justify="left")
    env.add_column("key", style="bold")
    env.add_column("value", overflow="fold")
    for k, v in h.env.items():
        env.add_row(shown(k), shown(v))
    out.print(env)
    if h.metadata:
        out.print("[bold]metadata[/bold]")
        out.print(
            printable(
                json.dumps(h.metadata, indent=1, sort_keys=True, ensure_ascii=False), newlines=True
            ),
            markup=False,
        )
    else:
        out.print("[bold]metadata[/bold] none")


def read_like(like: Path | None) -> TreeSpec | None:
    """The contract in ``--like`` (a spec JSON or a checkpoint), or None."""
    return None if like is None else spec_from_file(like)


# -- ckpt inspect --subtree: one part of a checkpoint ------------------------------


def _part(file: Path, subtree: str, ours: bool) -> Header:
    """The header of ``file`` cut to the part below ``subtree`` (its spec and
    tensors; the rest as stored), from the header alone."""
    if file.is_dir() or not ours:
        raise ConfigError(
            "--subtree lists a part of a treeguard checkpoint file; "
            "this is a sharded directory or another tool's file",
            context=str(file),
            hint="import the file first: treeguard import SRC DST",
        )
    h = read_header(file)
    sel = select(h.spec, subtree=subtree, ignore=(), where=h.path)
    return dataclasses.replace(h, spec=sel.spec, tensors=tuple(h.tensors[i] for i in sel.indices))


# -- end of ckpt inspect --subtree --------------------------------------------------


@ckpt.command("verify")
@click.argument("file", type=click.Path(path_type=Path))
@like_option("FILE must match")
def verify_command(file: Path, like: Path | None) -> None:
    """Check FILE's header, every tensor's hash and (with --like) its contract.

    FILE may also be a sharded checkpoint directory: every shard's digest is
    checked, reading the whole checkpoint in this process. A safetensors file
    another tool wrote has no hashes and no contract: its header's structure
    is checked, the report says what could not be, and the exit code is 3
    (not 0, so `verify FILE && deploy FILE` stops); `treeguard import` makes
    a checkpoint of it that verifies.
    """
    spec = read_like(like)
    if file.is_dir():
        _sharded(file, verify=True, like=spec, like_name=str(like))
        return
    foreign = foreign_or_none(file)
    if foreign is not None:
        verify_foreign(foreign, like=like)
    h = read_header(file)
    try:
        with _progress("verifying", h.data_bytes) as progress:
            verify_file(file, like=spec, progress=progress)
    except TreeMismatchError as e:
        raise e.from_sources(expected_from=str(like)) from e
    what = f", matches {shown(like)}" if like is not None else ""
    console().print(
        f"[green]ok[/green]: {shown(file)}: {h.spec.num_leaves} tensors, "
        f"{fmt_bytes(h.spec.nbytes)}, every {h.hash_name} matches{what}"
    )


def _sharded(
    directory: Path,
    *,
    as_json: bool = False,
    verify: bool = False,
    like: TreeSpec | None = None,
    like_name: str = "",
) -> None:
    """``inspect`` and ``verify`` of a sharded checkpoint directory."""
    from .._src.sharded import inspect as sharded

    try:
        report = sharded.verify(directory, like=like) if verify else sharded.summary(directory)
    except TreeMismatchError as e:
        raise e.from_sources(expected_from=like_name) from e
    if as_json:
        click.echo(json.dumps(report, indent=1, ensure_ascii=False))
    elif verify:
        shards = sum(p["shards"] for p in report["processes"])
        what = f", matches {shown(like_name)}" if like is not None else ""
        console().print(
            f"[green]ok[/green]: {shown(directory)}: {report['num_leaves']} arrays, {shards} "
            f"shards, {fmt_bytes(report['nbytes'])}, every {report['hash']} matches{what}"
        )
    else:
        console().print(printable(sharded.render(report), newlines=True), markup=False)


# -- ckpt migrate: a checkpoint carried over to a changed model ---------------------


def _split_rename(text: str) -> tuple[str, str]:
    """``A=B`` with A and B key paths; the split is the first ``=`` at which
    both sides read as key paths (a key may itself hold ``=``)."""
    for i, c in enumerate(text):
        if c != "=":
            continue
        old, new = text[:i], text[i + 1 :]
        try:
            parse(old)
            parse(new)
        except ValueError:
            continue
        return old, new
    raise ConfigError(
        f"--rename {printable(text)}: expected OLD=NEW, two key paths",
        hint="write it as ['a']=['b']",
    )


@ckpt.command("migrate")
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@like_option("of the changed model", dest="like_path", required=True)
@click.option(
    "--init",
    "init_target",
    metavar="MODULE:ATTR",
    default=None,
    help="The new leaves' values: a tree of arrays matched by key path (the new model's "
    "params: a dict, an nnx State, an equinox module), or a function from a key path to its "
    "array.",
)
@click.option(
    "--rename", "renames", multiple=True, metavar="OLD=NEW", help="Read OLD's leaves at NEW."
)
@click.option(
    "--drop", "drops", multiple=True, metavar="PATH", help="Leave the stored PATH unused."
)
def migrate_command(  # noqa: PLR0917 - click passes every option
    old: Path,
    new: Path,
    like_path: Path,
    init_target: str | None,
    renames: tuple[str, ...],
    drops: tuple[str, ...],
) -> None:
    """Write NEW, OLD carried over to the contract --like, verified, and print
    what changed: each path initialised, renamed or dropped.

    Without options every difference between OLD and --like is listed and
    the exit code is 1; --init, --rename and --drop name the differences
    that are meant. NEW's metadata keeps OLD's, the surgery report and where
    it came from. NEW keeps the containers of --like (an nnx State, an
    equinox module); it is written under a temporary name beside NEW and
    renamed only once it verifies, so a failed migration leaves nothing at
    NEW.
    """
    spec = spec_from_file(like_path)
    init: Any = None
    if init_target is not None:
        init = load_target(
            init_target,
            (object,),
            what="tree or function",
            command="ckpt migrate OLD NEW --like SPEC --init",
            fix="point --init at the new model's params, or a function of the key path",
        )
    h = read_header(old)
    tree, report = load(
        old,
        like=spec,
        expect_digest=h.digest,
        rename=dict(_split_rename(r) for r in renames),
        missing="init" if init is not None else "error",
        init=init,
        unexpected=list(drops) or "error",
        report=True,
    )
    meta = {k: v for k, v in h.metadata.items() if k != SURGERY_KEY}
    meta["migrated_from"] = {"file": str(old), "digest": h.digest}
    _write_verified(new, plain_leaves(spec.structure, tree), spec, meta, report)
    console().print(printable(str(report), newlines=True), markup=False, highlight=False)
    console().print(f"[green]ok[/green]: {shown(new)}: written and verified")


def _write_verified(
    new: Path, leaves: list[Any], spec: TreeSpec, meta: dict[str, Any], report: Surgery
) -> None:
    """Writes NEW under the contract's own structure (an nnx State or an
    equinox module stays one, though its class is not imported here) to a
    temporary name in NEW's directory, verifies it there, and only then
    renames it to NEW: a migration that fails leaves nothing at NEW (and a
    file already there untouched)."""
    target = os.path.abspath(new)
    tmp = temp_path(target)
    try:
        write_checkpoint(tmp, leaves, metadata=meta, surgery=report, structure=spec.structure)
        verify_file(tmp, like=spec)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(target))


# -- end of ckpt migrate ------------------------------------------------------------
