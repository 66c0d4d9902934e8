"""Exporting a version's serving function into the store.

``export_version`` exports a model's serving function (``exporting.py``),
reads the bytes back and checks them against the live model on its cases
(``validation.py``), then keeps them beside the version with their
description (``ArtifactStore.attach_exported``); the version's next verdict
covers them. Anything refused stores nothing.

The other side, serving it back, is ``served.py`` (a server imports
that one only, never the exporter and its validation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from ..errors import ExportError
from ..serving.release import params_like
from ..serving.spec import ServingSpec
from ..spec import TreeSpec
from ..store import ArtifactStore
from ..store.store import spec_of_version
from ..verify.model import Model
from . import compat
from .description import Description
from .exporting import export_serving
from .validation import validate


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What ``export_version`` stored.

    Attributes:
      version: the version the artifact belongs to.
      digest: the digest of its description, which the next verdict covers.
      nbytes: the artifact's size.
      description: the description stored beside it.
    """

    version: str
    digest: str
    nbytes: int
    description: Description


def export_version(
    model: Model,
    store: ArtifactStore,
    version: str,
    /,
    *,
    spec: ServingSpec | None = None,
    platforms: Sequence[str] | None = None,
) -> ExportResult:
    """Exports ``model``'s serving function for ``version``'s params and keeps it in the store.

    The function takes the params and the serving inputs as arguments, with
    a symbolic batch axis, so one artifact serves every bucket (a function
    that cannot take one is exported once per bucket of ``spec``). It is read
    back from its bytes and run against ``model.apply`` on the model's
    positive cases (and reference batches) at the model's tolerance before
    anything is written. Verify the version after (``store.verify``): its
    verdict then covers the artifact, and only then is it served.

    Args:
      model: the live ``treeguard.verify.Model``.
      store: the store holding ``version``.
      version: a version without an artifact.
      spec: the ``ServingSpec``; default every batch input of the model.
      platforms: the platforms to export for (``["cpu", "tpu"]``); default
        this process's. This process's must be among them (the export is
        checked here).

    Returns:
      The ``ExportResult``.

    Raises:
      ExportError: ``jax.export`` refused the function, or this process's
        platform is not among ``platforms``; nothing stored.
      ExportValidationError: the exported function differs from the live
        model on a case; nothing stored.
      StoreError: the version is unknown, being written or already holds an artifact.

    Example:
      >>> import tempfile, jax
      >>> import treeguard
      >>> from treeguard.examples import mlp
      >>> store = treeguard.ArtifactStore(tempfile.mkdtemp())
      >>> v = store.put(mlp.init(jax.random.key(0)))
      >>> result = export_version(mlp.model, store, v)
      >>> result.description.platforms == (jax.default_backend(),)  # where it runs
      True
      >>> result.description.validated[:2]
      ('standard', 'single')
      >>> store.verify(v).status
      'verified'
      >>> store.load_exported(v)[0]["platforms"] == [jax.default_backend()]
      True
    """
    spec = spec or ServingSpec.from_model(model)
    here = compat.here()
    if platforms is not None and here not in platforms:
        raise ExportError(
            f"model {model.name!r}: exporting for {', '.join(platforms)} only, and this process "
            f"runs on {here}, where the export cannot be checked against the live model",
            model=model.name,
            hint=f"add {here}: --platform {here} " + " ".join(f"--platform {p}" for p in platforms),
        )
    stored = spec_of_version(store, version)
    params = store.load_version(version, like=params_like(model))
    _same_order(model, stored, params)
    exports = export_serving(model, spec, params, platforms=platforms)
    exported = exports.exported[0]
    blob = b"".join(exports.blobs)
    description = Description(
        model=model.name,
        params=stored,
        serving=spec.to_dict(),
        outputs=_outputs(exported),
        rtol=float(model.rtol),
        atol=float(model.atol),
        platforms=tuple(exported.platforms),
        jax=jax.__version__,
        calling_convention=int(exported.calling_convention_version),
        validated=(),
        batches=exports.batches,
        parts=tuple(len(b) for b in exports.blobs),
    )
    readback = compat.deserialize(blob, description, version)
    validated = validate(model, spec, params, readback)
    description = dataclasses.replace(description, validated=tuple(validated))
    digest = store.attach_exported(version, blob, description.to_dict())
    return ExportResult(version, digest, len(blob), description)


def _same_order(model: Model, stored: TreeSpec, params: Any) -> None:
    """Refuses params whose flatten order is not the stored spec's (the
    order the artifact takes them in, and the server hands them over in)."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(params)]
    if paths != [leaf.path for leaf in stored.leaves]:
        raise ExportError(
            f"model {model.name!r}: its params flatten in another order than the version "
            "stores them",
            model=model.name,
            hint="put the params again from this model's init (store.put), then export that",
        )


def _outputs(exported: Any) -> list[dict[str, Any]]:
    skeleton = jax.tree.unflatten(exported.out_tree, list(range(len(exported.out_avals))))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(skeleton)]
    return [
        {"path": p, "shape": [str(d) for d in a.shape], "dtype": str(a.dtype)}
        for p, a in zip(paths, exported.out_avals)
    ]
