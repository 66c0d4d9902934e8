"""The ``treeguard ckpt`` and ``treeguard store`` command groups.

Exit codes, as for every treeguard command: 0 when the check passes, 1 when
it fails (a corrupt tensor, a contract mismatch, a refused promotion), 2 for
usage errors and unreadable input. ``ckpt verify`` exits 3 on a safetensors
file treeguard did not write: its structure was checked, and it holds no
hashes or contract to check its bytes against.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .._src.checkpoint import (
    Header,
    load_with_report,
    read_header,
    save,
    spec_from_file,
    verify_file,
)
from .._src.checkpoint.select import select
from .._src.errors import (
    ConfigError,
    FormatError,
    IntegrityError,
    TreeguardError,
    TreeMismatchError,
)
from .._src.paths import parse
from .._src.spec import TreeSpec
from .._src.surgery import METADATA_KEY as SURGERY_KEY
from .console import console
from .importing import foreign_or_none, inspect_foreign, shown, verify_foreign
from .verify import import_target

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
#: Files smaller than this verify too fast for a progress bar to help.
_PROGRESS_MIN_BYTES = 64 * 1024 * 1024


def _out() -> Console:
    return console()


def _err() -> Console:
    return console(stderr=True)


def _exit(code: int, message: str | None = None) -> NoReturn:
    if message:
        label = "[red]error:[/red]" if code == EXIT_USAGE else "[red]failed:[/red]"
        _err().print(label, end=" ")
        _err().print(message, markup=False)
    sys.exit(code)


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    value, units = float(n), ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while value >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{int(value)} B" if i == 0 else f"{value:.1f} {units[i]}"


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for long work; nothing for short work or a pipe."""
    console = _err()
    if total < _PROGRESS_MIN_BYTES or not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, _total: int) -> None:
            bar.update(task, completed=done)

        yield update


def _read_header_or_exit(file: Path) -> Header:
    try:
        return read_header(file)
    except IntegrityError as e:
        _exit(EXIT_FAIL, str(e))
    except (FormatError, OSError) as e:
        _exit(EXIT_USAGE, f"{file}: {e}" if isinstance(e, OSError) else str(e))


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


@click.group("ckpt", context_settings={"help_option_names": ["-h", "--help"]})
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
    h = _read_header_or_exit(file) if subtree is None else _part(file, subtree, foreign is None)
    if as_json:
        click.echo(json.dumps(_header_json(h), indent=1, ensure_ascii=False))
        return
    out = _out()
    params = h.spec.num_params
    out.print(
        f"[bold]{shown(file)}[/bold]  {h.format}  {h.spec.num_leaves} tensors  "
        f"{params:,} params  {_human(h.spec.nbytes)} of data  {_human(h.file_bytes)} file"
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
            shown(t.name) or "<root>", t.summary(), f"{t.size:,}", _human(t.nbytes), t.digest[:16]
        )
    out.print(table)
    env = Table(title="environment", box=None, show_header=False, title_justify="left")
    env.add_column("key", style="bold")
    env.add_column("value", overflow="fold")
    for k, v in h.env.items():
        env.add_row(str(k), str(v))
    out.print(env)
    if h.metadata:
        out.print("[bold]metadata[/bold]")
        out.print(
            json.dumps(h.metadata, indent=1, sort_keys=True, ensure_ascii=False), markup=False
        )
    else:
        out.print("[bold]metadata[/bold] none")


# -- ckpt inspect --subtree: one part of a checkpoint ------------------------------


def _part(file: Path, subtree: str, ours: bool) -> Header:
    """The header of ``file`` cut to the part below ``subtree`` (its spec and
    tensors; the rest as stored), from the header alone."""
    if file.is_dir() or not ours:
        _exit(
            EXIT_USAGE,
            f"{shown(file)}: --subtree lists a part of a treeguard checkpoint file; "
            "this is a sharded directory or another tool's file",
        )
    h = _read_header_or_exit(file)
    try:
        sel = select(h.spec, subtree=subtree, ignore=(), where=h.path)
    except ConfigError as e:
        _exit(EXIT_USAGE, str(e))
    return dataclasses.replace(h, spec=sel.spec, tensors=tuple(h.tensors[i] for i in sel.indices))


# -- end of ckpt inspect --subtree --------------------------------------------------


def _read_like(like: Path | None) -> TreeSpec | None:
    if like is None:
        return None
    try:
        return spec_from_file(like)
    except (FormatError, OSError, TreeguardError) as e:
        _exit(EXIT_USAGE, f"{like}: {e}")


@ckpt.command("verify")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--like",
    type=click.Path(path_type=Path),
    default=None,
    help="A spec JSON or checkpoint whose contract FILE must match.",
)
def verify_command(file: Path, like: Path | None) -> None:
    """Check FILE's header, every tensor's hash and (with --like) its contract.

    FILE may also be a sharded checkpoint directory: every shard's sha256 is
    checked, reading the whole checkpoint in this process. A safetensors file
    another tool wrote has no hashes and no contract: its header's structure
    is checked, the report says what could not be, and the exit code is 3
    (not 0, so `verify FILE && deploy FILE` stops); `treeguard import` makes
    a checkpoint of it that verifies.
    """
    spec = _read_like(like)
    if file.is_dir():
        _sharded(file, verify=True, like=spec, like_name=str(like))
        return
    foreign = foreign_or_none(file)
    if foreign is not None:
        verify_foreign(foreign, like=like)
    h = _read_header_or_exit(file)
    try:
        with _progress("verifying", h.data_bytes) as progress:
            verify_file(file, like=spec, progress=progress)
    except (TreeMismatchError, IntegrityError) as e:
        _exit(EXIT_FAIL, str(e).replace("`like`", str(like)))
    except (FormatError, OSError) as e:
        _exit(EXIT_USAGE, str(e))
    what = f", matches {like}" if like is not None else ""
    _out().print(
        f"[green]ok[/green]: {shown(file)}: {h.spec.num_leaves} tensors, {_human(h.spec.nbytes)}, "
        f"every {h.hash_name} matches{what}"
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
    except (TreeMismatchError, IntegrityError) as e:
        _exit(EXIT_FAIL, str(e).replace("`like`", like_name))
    except (FormatError, OSError) as e:
        _exit(EXIT_USAGE, str(e))
    if as_json:
        click.echo(json.dumps(report, indent=1, ensure_ascii=False))
    elif verify:
        shards = sum(p["shards"] for p in report["processes"])
        what = f", matches {like_name}" if like is not None else ""
        _out().print(
            f"[green]ok[/green]: {directory}: {report['num_leaves']} arrays, {shards} shards, "
            f"{_human(report['nbytes'])}, every sha256 matches{what}"
        )
    else:
        _out().print(sharded.render(report), markup=False)


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
    _exit(EXIT_USAGE, f"--rename {shown(text)}: expected OLD=NEW, two key paths like ['a']=['b']")


@ckpt.command("migrate")
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option(
    "--like",
    "like_path",
    type=click.Path(path_type=Path),
    required=True,
    help="A spec JSON or checkpoint: the changed model's contract.",
)
@click.option(
    "--init",
    "init_target",
    metavar="MODULE:ATTR",
    default=None,
    help="The new leaves' values: a tree of arrays matched by key path, or a function "
    "from a key path to its array.",
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
    it came from.
    """
    spec = _read_like(like_path)
    init: Any = None
    if init_target is not None:
        try:
            init = import_target(
                init_target,
                (object,),
                what="tree or function",
                command="ckpt migrate OLD NEW --like SPEC --init",
                fix="point --init at the new model's params, or a function of the key path",
            )
        except ConfigError as e:
            _exit(EXIT_USAGE, str(e))
    h = _read_header_or_exit(old)
    try:
        tree, report = load_with_report(
            old,
            like=spec,
            expect_digest=h.digest,
            rename=dict(_split_rename(r) for r in renames),
            missing="init" if init is not None else "error",
            init=init,
            unexpected=list(drops) or "error",
        )
    except (TreeMismatchError, IntegrityError) as e:
        _exit(EXIT_FAIL, str(e))
    except (ConfigError, FormatError, ValueError, OSError) as e:
        _exit(EXIT_USAGE, str(e))
    meta = {k: v for k, v in h.metadata.items() if k != SURGERY_KEY}
    meta["migrated_from"] = {"file": str(old), "digest": h.digest}
    try:
        save(new, tree, metadata=meta, surgery=report)
        verify_file(new, like=spec)
    except (TreeguardError, OSError) as e:
        _exit(EXIT_USAGE, f"{new}: {e}")
    _out().print(str(report), markup=False, highlight=False)
    _out().print(f"[green]ok[/green]: {shown(new)}: written and verified")


# -- end of ckpt migrate ------------------------------------------------------------
