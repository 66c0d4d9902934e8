"""The regression references: the stored cases and what the model gave on them.

One references file holds the params ``init`` gave, every case's batch and,
for the positive cases, the outputs, loss and grads. It is one checkpoint
(safetensors with a JSON manifest in its header), so any safetensors reader
opens it and bf16 leaves round-trip. The manifest records the format
version, the environment fingerprint, the seed, the tolerances and each
negative case's expected exception.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .. import checkpoint
from ..errors import FormatError
from .cases import Case

FORMAT = "treeguard.regression/1"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Expected:
    """What the model gave on one positive case when the references were recorded."""

    outputs: Any
    loss: Any
    grads: Any


@dataclasses.dataclass(frozen=True)
class References:
    """A references file, read back.

    Attributes:
      path: where it was read from.
      params: the params ``init`` gave.
      cases: every stored case, positive and negative, in stored order.
      expected: for each positive case's name, its ``Expected``.
      environment: the fingerprint of the recording run.
      tolerances: the tolerances declared when recording.
      seed: the seed used.
      manifest: the whole manifest.
    """

    path: Path
    params: Any
    cases: tuple[Case, ...]
    expected: dict[str, Expected]
    environment: dict[str, Any]
    tolerances: dict[str, Any]
    seed: int
    manifest: dict[str, Any]


def _exc_name(t: type[BaseException]) -> str:
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _exc_type(name: str) -> type[BaseException]:
    import builtins
    import importlib

    if "." not in name:
        t = getattr(builtins, name, None)
    else:
        mod, _, qual = name.rpartition(".")
        try:
            t = importlib.import_module(mod)
            for part in qual.split("."):
                t = getattr(t, part)
        except (ImportError, AttributeError):
            t = None
    if not (isinstance(t, type) and issubclass(t, BaseException)):
        raise FormatError(f"references name the exception {name!r}, which cannot be imported")
    return t


def save(
    path: str | os.PathLike[str],
    *,
    params: Any,
    cases: list[Case],
    expected: dict[str, Expected],
    tolerances: dict[str, Any],
    seed: int,
    model_name: str,
) -> Path:
    """Writes the references file atomically.

    Returns:
      The path written.

    Raises:
      InvalidTreeError: if a tree holds something that is not an array.
    """
    tree: dict[str, Any] = {"params": params, "cases": {}, "invalid": {}}
    case_meta = []
    for case in cases:
        if case.negative:
            tree["invalid"][case.name] = {"batch": case.batch}
        else:
            exp = expected[case.name]
            tree["cases"][case.name] = {
                "batch": case.batch,
                "outputs": exp.outputs,
                "loss": exp.loss,
                "grads": exp.grads,
            }
        case_meta.append(
            {"name": case.name, "note": case.note, "raises": [_exc_name(r) for r in case.raises]}
        )
    tree = jax.tree.map(np.asarray, tree)
    metadata = {
        "format": FORMAT,
        "model": model_name,
        "seed": seed,
        "tolerances": tolerances,
        "cases": case_meta,
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save(target, tree, metadata=metadata)
    return target


def load(path: str | os.PathLike[str]) -> References:
    """Reads a references file back, every hash verified.

    Raises:
      FileNotFoundError: if there is no file.
      FormatError: if it is not a references file of a known version.
      IntegrityError: if stored bytes do not match their hashes.
    """
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"no references at {source}")
    header = checkpoint.read_header(source)
    meta = header.metadata
    if not isinstance(meta, dict) or not isinstance(meta.get("format"), str):
        raise FormatError(f"{source}: a checkpoint, but no treeguard regression manifest")
    fmt = meta["format"]
    if not fmt.startswith("treeguard.regression/"):
        raise FormatError(f"{source}: format {fmt!r} is not {FORMAT!r}")
    if int(fmt.rsplit("/", 1)[1]) > FORMAT_VERSION:
        raise FormatError(
            f"{source}: references format {fmt!r} is newer than this treeguard reads "
            f"({FORMAT!r}); hint: upgrade treeguard"
        )
    tree = checkpoint.load(source)
    cases: list[Case] = []
    expected: dict[str, Expected] = {}
    for c in meta.get("cases", []):
        name = c["name"]
        raises = tuple(_exc_type(r) for r in c.get("raises", []))
        try:
            if raises:
                batch = tree["invalid"][name]["batch"]
            else:
                stored = tree["cases"][name]
                batch = stored["batch"]
                expected[name] = Expected(stored["outputs"], stored["loss"], stored["grads"])
        except (KeyError, TypeError) as e:
            raise FormatError(
                f"{source}: the manifest names case {name!r} but the file lacks {e}; "
                "hint: re-record with --record"
            ) from e
        cases.append(Case(name, batch, raises, c.get("note", "")))
    return References(
        path=source,
        params=tree["params"],
        cases=tuple(cases),
        expected=expected,
        environment=dict(header.env),
        tolerances=dict(meta.get("tolerances", {})),
        seed=int(meta.get("seed", 0)),
        manifest=meta,
    )
