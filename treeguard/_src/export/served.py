"""A version's exported artifact served back: ``served_from_store``.

The current (or a given) version's artifact, through the store's gates
(verified, signed where the store has a key, the artifact the verdict
covers, every byte matching), checked to run on this jax and platform, made
into a ``Model`` for the server. Its ``check`` is what the server runs on
every version it loads or returns to (start, swap, rollback): the same
gates, and the same function as the one served. A server imports this
module only: not the exporter (``api.py``) and its validation.
"""

from __future__ import annotations

import dataclasses

from .. import strictjson
from ..errors import ArtifactError, StoreError
from ..serving.spec import ServingSpec
from ..store import ArtifactStore
from ..verify.model import Model
from . import compat
from .description import Description
from .model import artifact_model


@dataclasses.dataclass(frozen=True)
class Served:
    """A version's artifact made ready to serve.

    Attributes:
      model: the ``Model`` that runs the artifact.
      spec: the serving spec it was exported for.
      version: the version whose artifact it is.
      function: what the served artifact computes (``compat.function_of``).
      store: the store.
      parsed: ``{description: function}`` of the artifacts read so far, each
        description as its canonical JSON (it names its bytes' digest), so
        bytes the store's gate has just passed again are not parsed again
        (see ``check``).
    """

    model: Model
    spec: ServingSpec
    version: str
    function: str
    store: ArtifactStore
    parsed: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def check(self, version: str) -> None:
        """What the server runs on every version before it loads or returns
        to it: its artifact passes the store's gates and runs here, and it
        is the function served (a version with another function needs a
        server of its own).

        Every call passes the store's gate again (the verdict, the
        description's digest, every byte's); what the bytes compute is
        parsed only for a description not read before: the same description
        names the same bytes' digest, so they read as they did.

        Raises:
          ArtifactError: naming the version and what differs (and, for
            another version than the served artifact's, that one too).
          StoreError: if the version is not verified (or its verdict is forged).
        """
        try:
            meta, blob = self.store.load_exported(version)
            description = Description.from_dict(meta, context=f"version {version}")
            compat.check_servable(description, version)
            key = strictjson.dumps(meta)
            function = self.parsed.get(key)
            if function is None:
                function = compat.function_of(compat.deserialize(blob, description, version))
                self.parsed[key] = function
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
    function = compat.function_of(table)
    return Served(
        artifact_model(description, table, spec),
        spec,
        chosen,
        function,
        store,
        {strictjson.dumps(meta): function},
    )
