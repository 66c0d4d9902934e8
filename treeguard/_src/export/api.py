"""Exporting a version's serving function into the store, and serving it back.

``export_version`` exports a model's serving function (``exporting.py``),
reads the bytes back and checks them against the live model on its cases
(``validation.py``), then keeps them beside the version with their
description (``ArtifactStore.attach_exported``); the version's next verdict
covers them. Anything refused stores nothing.

``served_from_store`` is the other side: the current (or a given) version's
artifact, through the store's gates (verified, signed where the store has
a key, the artifact the verdict covers, every byte matching), checked to
run on this jax and platform, made into a ``Model`` for the server. Its
``check`` is what the server runs on every version it loads or returns to
(start, swap, rollback): the same gates, and the same function as the one
served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from ..errors import ArtifactError, ExportError, StoreError
from ..serving.release import params_like
from ..serving.spec import ServingSpec
from ..spec import TreeSpec
from ..store import ArtifactStore
from ..store.store import spec_of_version
from ..verify.model import Model
from . import compat
from .description import Description
from .exporting import export_serving
from .model import artifact_model
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
      >>> result.description.platforms, result.description.validated[:2]
      (('cpu',), ('standard', 'single'))
      >>> store.verify(v).status
      'verified'
      >>> store.load_exported(v)[0]["platforms"]
      ['cpu']
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


@dataclasses.dataclass(frozen=True)
class Served:
    """A version's artifact made ready to serve.

    Attributes:
      model: the ``Model`` that runs the artifact.
      spec: the serving spec it was exported for.
      version: the version whose artifact it is.
      function: what the served artifact computes (``compat.function_of``).
      store: the store.
    """

    model: Model
    spec: ServingSpec
    version: str
    function: str
    store: ArtifactStore

    def check(self, version: str) -> None:
        """What the server runs on every version before it loads or returns
        to it: its artifact passes the store's gates and runs here, and it
        is the function served (a version with another function needs a
        server of its own).

        Raises:
          ArtifactError: naming the version and what differs (and, for
            another version than the served artifact's, that one too).
          StoreError: if the version is not verified (or its verdict is forged).
        """
        try:
            meta, blob = self.store.load_exported(version)
            description = Description.from_dict(meta, context=f"version {version}")
            compat.check_servable(description, version)
            table = compat.deserialize(blob, description, version)
        except ArtifactError as e:
            if version == self.version:
                raise
            raise ArtifactError(
                f"version {version} cannot replace the exported function served (version "
                f"{self.version}'s): {e.message}",
                version=version,
                field=e.field,
                context=e.context,
                hint=e.hint,
            ) from e
        function = compat.function_of(table)
        if function != self.function:
            raise ArtifactError(
                f"version {version}'s exported function is not the one served (version "
                f"{self.version}'s): {function[:12]}…, served {self.function[:12]}…",
                version=version,
                field="function",
                hint="promote it and start a server on it: treeguard serve --store STORE",
            )


def served_from_store(
    store: ArtifactStore, version: str | None = None, *, spec: ServingSpec | None = None
) -> Served:
    """The artifact of ``version`` (default: the store's current one), ready to serve.

    Args:
      store: the store.
      version: the version; None for the current one.
      spec: a serving spec to serve under instead of the artifact's (its
        inputs must be the artifact's).

    Returns:
      The ``Served`` artifact (its ``model`` and ``spec`` go to ``Server``,
      its ``check`` as ``version_check``).

    Raises:
      StoreError: if there is no current version, or it is not verified.
      SignatureError: for a verdict the store's key does not vouch for.
      ArtifactError: for an artifact that is missing, not covered by the
        verdict, changed, or written for another jax or platform.
      FormatError: for a description this treeguard cannot read.
    """
    chosen = version or store.current()
    if chosen is None:
        raise StoreError(
            f"the store {store.root} has no current version",
            hint="put, export, verify and promote one first",
        )
    meta, blob = store.load_exported(chosen)
    description = Description.from_dict(meta, context=f"version {chosen}")
    compat.check_servable(description, chosen)
    table = compat.deserialize(blob, description, chosen)
    own = ServingSpec.from_dict(description.serving)
    if spec is not None and spec.inputs != own.inputs:
        raise ArtifactError(
            f"the serving spec's inputs are not the ones version {chosen}'s artifact was "
            f"exported for ({', '.join(own.input_paths)})",
            version=chosen,
            field="inputs",
            hint="leave --spec out to serve the artifact's own spec, or give one with its inputs",
        )
    spec = spec or own
    return Served(
        artifact_model(description, table, spec),
        spec,
        chosen,
        compat.function_of(table),
        store,
    )
