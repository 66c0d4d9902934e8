"""The regression references: the stored cases and what the model gave on them.

One references file holds the params ``init`` gave, every case's batch and,
for the positive cases, the outputs, loss and grads. It is one checkpoint
(safetensors with a JSON manifest in its header), so any safetensors reader
opens it and bf16 leaves round-trip. The manifest records the format
version, the environment fingerprint, the seed, the tolerances and each
negative case's expected exception.

References are per backend: a model declares one file, which holds the
references recorded on the CPU; those recorded on another backend sit beside
it under the backend's name (``mlp.regression.tpu.safetensors``). A run reads
its own backend's when they exist (``resolve``) and records to its own
backend's (``backend_path``), so recording on a TPU leaves the CPU's alone.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .. import checkpoint, errors
from ..errors import FormatError
from ..spec import TreeSpec
from . import model as model_module
from .cases import Case
from .model import Model
from .programs import Evaluated

#: The backends whose references ``resolve`` looks for beside the declared file.
BACKENDS = ("cpu", "gpu", "tpu")

FORMAT = "treeguard.regression/1"
FORMAT_VERSION = 1
_FORMAT_RE = re.compile(r"treeguard\.regression/([0-9]{1,9})")


@dataclasses.dataclass(frozen=True)
class References:
    """A references file, read back.

    Attributes:
      path: where it was read from.
      params: the params ``init`` gave.
      cases: every stored case, positive and negative, in stored order.
      expected: for each positive case's name, its ``Evaluated``.
      environment: the fingerprint of the recording run.
      tolerances: the tolerances declared when recording.
      seed: the seed used.
      manifest: the whole manifest.
      spec: the file's stored spec of the whole tree (``params``, ``cases``,
        ``invalid``), class names of custom nodes included.
    """

    path: Path
    params: Any
    cases: tuple[Case, ...]
    expected: dict[str, Evaluated]
    environment: dict[str, Any]
    tolerances: dict[str, Any]
    seed: int
    manifest: dict[str, Any]
    spec: TreeSpec

    @property
    def backend(self) -> str | None:
        """The backend the references were computed on (``cpu``, ``tpu``...)."""
        value = self.environment.get("backend")
        return value if isinstance(value, str) else None

    @property
    def device_kind(self) -> str | None:
        """The device kind they were computed on (``TPU v5 lite``, ``cpu``)."""
        value = self.environment.get("device_kind")
        return value if isinstance(value, str) else None

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], /, *, exceptions: Iterable[type[BaseException]] = ()
    ) -> References:
        """Reads a references file back, every hash verified.

        Each negative case's expected exception is stored by name. A name is
        resolved only to a builtin exception, to one of treeguard's errors, or
        to one of ``exceptions``: nothing named in a file is ever imported.

        Args:
          path: the references file.
          exceptions: the exception types the model declares for its invalid
            inputs (``declared_exceptions(model)``), which the file may name.

        Returns:
          The ``References``.

        Raises:
          FileNotFoundError: if there is no file.
          FormatError: if it is not a references file of a known version, or it
            names an exception that is none of the above.
          IntegrityError: if stored bytes do not match their hashes.

        Example:
          >>> import os, tempfile
          >>> from treeguard.examples.mlp import model
          >>> from treeguard._src.verify.run import record_references
          >>> p = record_references(model, os.path.join(tempfile.mkdtemp(), "r.safetensors"))
          >>> References.load(p).cases[-1].raises
          (<class 'ValueError'>,)
        """
        return load_references(path, exceptions=exceptions)


def backend_path(declared: str | os.PathLike[str], backend: str) -> Path:
    """Where references recorded on ``backend`` go: the declared file for the
    CPU, and beside it, named for the backend, for another one.

    Example:
      >>> backend_path("data/mlp.regression.safetensors", "tpu").name
      'mlp.regression.tpu.safetensors'
      >>> backend_path("data/mlp.regression.safetensors", "cpu").name
      'mlp.regression.safetensors'
    """
    path = Path(declared)
    if backend == "cpu":
        return path
    return path.with_name(f"{path.stem}.{backend}{path.suffix}")


def resolve(declared: str | os.PathLike[str], backend: str) -> Path:
    """The references a run on ``backend`` compares with: its own backend's
    when they exist, else the declared file, else another backend's; the
    declared path when there are none (for the error that names it).

    Example:
      >>> import tempfile
      >>> declared = Path(tempfile.mkdtemp()) / "m.regression.safetensors"
      >>> resolve(declared, "tpu") == declared  # none at all
      True
      >>> _ = backend_path(declared, "tpu").write_bytes(b"")
      >>> resolve(declared, "tpu").name, resolve(declared, "cpu").name
      ('m.regression.tpu.safetensors', 'm.regression.tpu.safetensors')
      >>> _ = declared.write_bytes(b"")
      >>> resolve(declared, "tpu").name, resolve(declared, "cpu").name
      ('m.regression.tpu.safetensors', 'm.regression.safetensors')
    """
    own = backend_path(declared, backend)
    for candidate in (own, Path(declared), *(backend_path(declared, b) for b in BACKENDS)):
        if candidate.exists():
            return candidate
    return Path(declared)


def _exc_name(t: type[BaseException]) -> str:
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _treeguard_errors() -> dict[str, type[BaseException]]:
    """Every exception class treeguard defines, by each name a references
    file may use for it: its public face's (``treeguard.serving.X``) and, for
    files recorded before, ``treeguard.X`` (every class's name until each
    named its face) and the older private module paths."""
    found: dict[str, type[BaseException]] = {}
    for cls in errors.CLASSES:
        found[_exc_name(cls)] = cls
        found[f"treeguard.{cls.__qualname__}"] = cls
        found[f"treeguard._src.errors.{cls.__qualname__}"] = cls
    for legacy in ("NonFiniteError", "TracedValueError"):
        found[f"treeguard._src.nonfinite.{legacy}"] = getattr(errors, legacy)
    for legacy in ("StoreError", "UnknownVersionError"):
        found[f"treeguard._src.store.{legacy}"] = getattr(errors, legacy)
    for value in vars(model_module).values():
        if (
            isinstance(value, type)
            and issubclass(value, BaseException)
            and value.__module__ == model_module.__name__
        ):
            found[_exc_name(value)] = value
    return found


def _exc_type(
    name: str, declared: Mapping[str, type[BaseException]], source: Path
) -> type[BaseException]:
    """The exception a references file names, without importing anything.

    Only a builtin exception, one of treeguard's own errors, or one the
    model declares for its invalid inputs is resolved: a name read from a
    file never makes Python import (and so run) a module.
    """
    if not isinstance(name, str):
        raise FormatError(f"{source}: the manifest names the exception {name!r}, not a name")
    if "." not in name:
        t = getattr(builtins, name, None)
        if isinstance(t, type) and issubclass(t, BaseException):
            return t
    known = _treeguard_errors()
    known.update(declared)
    t = known.get(name)
    if t is None:
        raise FormatError(
            f"{source}: the references name the exception {name!r}, which is neither a builtin "
            "exception, nor a treeguard error, nor one the model declares for its invalid "
            "inputs; hint: declare it in Model.invalid_raises or InvalidInput(raises=...), "
            "or re-record with --record"
        )
    return t


def declared_exceptions(model: Model) -> list[type[BaseException]]:
    """The exception types ``model`` declares for its invalid inputs.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> declared_exceptions(model)
      [<class 'ValueError'>]
    """
    out = list(model.invalid_raises)
    for inv in model.invalid_inputs:
        raises = inv.raises if isinstance(inv.raises, tuple) else (inv.raises,)
        out += [r for r in raises if r not in out]
    return list(dict.fromkeys(out))


def save_references(
    path: str | os.PathLike[str],
    *,
    params: Any,
    cases: list[Case],
    expected: dict[str, Evaluated],
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


def load_references(
    path: str | os.PathLike[str], /, *, exceptions: Iterable[type[BaseException]] = ()
) -> References:
    """``References.load``, whose docstring says what it reads and refuses."""
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"no references at {source}")
    header = checkpoint.read_header(source)
    meta = header.metadata
    if not isinstance(meta, dict) or not isinstance(meta.get("format"), str):
        raise FormatError(f"{source}: a checkpoint, but no treeguard regression manifest")
    fmt = meta["format"]
    version = _FORMAT_RE.fullmatch(fmt)
    if version is None:
        raise FormatError(
            f"{source}: format {fmt!r} is not {FORMAT!r}; hint: a references file says "
            "'treeguard.regression/<version>'; re-record it with --record"
        )
    if int(version.group(1)) > FORMAT_VERSION:
        raise FormatError(
            f"{source}: references format {fmt!r} is newer than this treeguard reads "
            f"({FORMAT!r}); hint: upgrade treeguard"
        )
    declared = {_exc_name(t): t for t in exceptions}
    tree = checkpoint.load(source)
    cases: list[Case] = []
    expected: dict[str, Evaluated] = {}
    for c in meta.get("cases", []):
        name = c["name"]
        raises = tuple(_exc_type(r, declared, source) for r in c.get("raises", []))
        try:
            if raises:
                batch = tree["invalid"][name]["batch"]
            else:
                stored = tree["cases"][name]
                batch = stored["batch"]
                expected[name] = Evaluated(stored["outputs"], stored["loss"], stored["grads"])
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
        spec=header.spec,
    )
