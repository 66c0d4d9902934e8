"""``treeguard import``: foreign weights into a verified checkpoint.

Exit codes: 0 imported; 1 the weights do not match ``--like`` (every
mismatch listed, nothing written); 2 unreadable input, a missing optional
library or a usage error.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import NoReturn

import click
from rich.table import Table

from .._src.checkpoint import ForeignHeader, import_weights, load, spec_from_file
from .._src.checkpoint.foreignheader import read_foreign_header
from .._src.display import fmt_bytes, printable
from .._src.errors import TreeMismatchError
from .._src.store import ArtifactStore
from .._src.store.objects import is_url
from .console import console, shown
from .failures import PARTIAL, Command
from .options import like_option


@click.command("import", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--names",
    type=click.Choice(["dotted", "slashed", "keypath", "flat"]),
    default="dotted",
    show_default=True,
    help="How tensor names map to key paths: encoder.layer.0.w, encoder/layer/0/w, "
    "['encoder']['layer'][0]['w'], or one flat dict keyed by name.",
)
@like_option("the weights must match; the result takes its structure")
def import_command(src: Path, dst: Path, names: str, like: Path | None) -> None:
    """Turn the weights in SRC into a verified treeguard checkpoint DST.

    SRC is a safetensors file (Hugging Face, MLX...), an .npz archive, a flax
    msgpack file or an orbax checkpoint directory. Without --like the tree is
    nested by the names, each component a string key (encoder.layer.0.w
    becomes ['encoder']['layer']['0']['w']). DST is written atomically with a
    BLAKE3 digest per tensor and the tree's contract; its metadata records SRC
    and SRC's BLAKE3 digest. A DST that is a store in a bucket
    (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX) gets the weights as a new
    candidate version instead: verify and promote it with `treeguard store`.
    """
    spec = None if like is None else spec_from_file(like)
    store = ArtifactStore(dst) if is_url(dst) else None
    target = shown(dst)
    if store is not None:
        store.current()  # a prefix that is not a store is refused before SRC is read
    try:
        with tempfile.TemporaryDirectory(prefix="treeguard-import-") as tmp:
            out = Path(tmp) / "model.safetensors" if store is not None else dst
            header = import_weights(src, out, names=names, like=spec)  # type: ignore[arg-type]
            if store is not None:  # a new candidate version of the store in the bucket
                version = store.put(load(out), metadata=header.metadata)
                target = f"{shown(store.root)} version {version} (a candidate)"
    except TreeMismatchError as e:
        raise e.from_sources(expected_from=str(like)) from e
    s = header.spec
    what = f", matches {shown(like)}" if like is not None else ""
    console().print(
        f"[green]imported[/green]: {shown(src)} "
        f"({shown(header.metadata['imported_from']['format'])}) -> {target}: "
        f"{s.num_leaves} tensors, {s.num_params:,} params, "
        f"a {header.hash_name} digest for each{what}"
    )


# -- ``ckpt inspect`` and ``ckpt verify`` of a foreign safetensors file ---------------

_LACKS = (
    "no contract (spec) and no hashes: a safetensors file treeguard did not write, "
    "so nothing says which tree it belongs to or that its bytes are the ones meant"
)


def foreign_or_none(file: Path) -> ForeignHeader | None:
    """FILE's header if it is a foreign safetensors file; None for anything
    else (a checkpoint).

    Raises:
      FormatError: if FILE's header does not describe the file.
    """
    return read_foreign_header(file)


def inspect_foreign(h: ForeignHeader, *, as_json: bool) -> None:
    """Prints a foreign file's tensors and what it lacks."""
    tensors = sorted(h.tensors, key=lambda t: t.name)
    params = sum(t.size for t in tensors)
    data = sum(t.nbytes for t in tensors)
    if as_json:
        doc = {
            "file": h.path,
            "format": "safetensors",
            "treeguard_checkpoint": False,
            "contract": None,
            "hashes": None,
            "lacks": ["contract", "hashes"],
            "num_leaves": len(tensors),
            "num_params": params,
            "nbytes": data,
            "file_bytes": h.file_bytes,
            "tensors": [
                {
                    "name": t.name,
                    "dtype": t.dtype.name,
                    "stored_as": t.stored_dtype,
                    "shape": list(t.shape),
                    "params": t.size,
                    "nbytes": t.nbytes,
                    "data_offsets": [t.begin, t.end],
                }
                for t in tensors
            ],
            "metadata": h.metadata,
        }
        click.echo(json.dumps(doc, indent=1, ensure_ascii=False))
        return
    out = console()
    out.print(
        f"[bold]{shown(h.path)}[/bold]  safetensors (not a treeguard checkpoint)  {len(tensors)} "
        f"tensors  {params:,} params  {fmt_bytes(data)} of data  {fmt_bytes(h.file_bytes)} file"
    )
    table = Table(box=None, pad_edge=False, show_edge=False)
    for col, justify in (("name", "left"), ("array", "left"), ("params", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    table.add_column("bytes", justify="right")
    for t in tensors:
        table.add_row(shown(t.name), t.summary(), f"{t.size:,}", fmt_bytes(t.nbytes))
    out.print(table)
    out.print(f"[yellow]lacks[/yellow]: {_LACKS}", markup=True)
    if h.metadata:
        out.print("[bold]metadata[/bold]")
        out.print(
            printable(json.dumps(h.metadata, indent=1, sort_keys=True, ensure_ascii=False)),
            markup=False,
        )
    out.print(
        f"hint: treeguard import {printable(h.path)} OUT.safetensors [--like SPEC] makes a "
        "verified checkpoint of it",
        markup=False,
    )


def verify_foreign(h: ForeignHeader, *, like: Path | None) -> NoReturn:
    """Reports what could and could not be checked; exits ``PARTIAL`` (3): its
    structure is sound, but no hash or contract could be checked. Not 0, so
    ``verify FILE && deploy FILE`` stops."""
    out = console()
    out.print(
        f"[yellow]structure only[/yellow]: {shown(h.path)}: "
        "a safetensors file treeguard did not write"
    )
    out.print(
        f"  checked: the header (its length inside the file, strict JSON), and for each of "
        f"{len(h.tensors)} tensors its dtype (a known safetensors dtype), shape, size "
        f"(shape x itemsize = its bytes) and offsets (inside the file, contiguous, no gap "
        f"or overlap, {fmt_bytes(h.data_bytes)} of data covered exactly)",
        markup=False,
    )
    out.print(
        "  not checked: the bytes themselves (the file holds no hashes: any values of the "
        "right size pass) and the contract (it holds no spec)"
        + (f"; --like {printable(like)} needs a naming rule, which import takes" if like else ""),
        markup=False,
    )
    out.print(
        f"hint: treeguard import {printable(h.path)} OUT.safetensors"
        + (f" --like {printable(like)}" if like else "")
        + " makes a checkpoint that verifies",
        markup=False,
    )
    click.get_current_context().exit(PARTIAL)
