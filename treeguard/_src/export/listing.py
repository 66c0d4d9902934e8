"""What each of a store's versions holds of an exported artifact, for a
listing (``treeguard store ls``): no JAX, nothing parsed but JSON, none of
an artifact's bytes read.

The store's cheap look (``ArtifactStore.peek_exported``) finds each
version's description, checks it against the digest its (signed) verdict
covers and finds the bytes; the platforms and the jax shown are that
description's. Hashing every byte is the gate's, at every load a server
makes (``load_exported``), never a listing's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ..errors import FormatError
from .description import Description


@dataclasses.dataclass(frozen=True)
class Listed:
    """One version's artifact as a listing shows it.

    Attributes:
      state: one of the store's ``exported.STATES``.
      platforms: the platforms it was exported for (a ``covered`` one only).
      jax: the jax that wrote it (a ``covered`` one only).
    """

    state: str
    platforms: tuple[str, ...] = ()
    jax: str | None = None

    def cell(self) -> str:
        """The listing's cell: ``cpu, tpu (jax 0.10.2)``, else the state.

        Example:
          >>> Listed("covered", ("cpu", "tpu"), "0.10.2").cell(), Listed("uncovered").cell()
          ('cpu, tpu (jax 0.10.2)', 'uncovered')
        """
        if self.state != "covered":
            return self.state
        return f"{', '.join(self.platforms)} (jax {self.jax})"

    def as_json(self) -> dict[str, Any]:
        """``{"state", "platforms", "jax"}`` (the last two null unless covered)."""
        covered = self.state == "covered"
        return {
            "state": self.state,
            "platforms": list(self.platforms) if covered else None,
            "jax": self.jax if covered else None,
        }


def listed(store: Any, versions: Iterable[Any]) -> dict[str, Listed]:
    """The artifact of each of ``versions`` that holds one.

    Args:
      store: the ``ArtifactStore``.
      versions: its ``VersionInfo`` records (``store.versions()``).

    Returns:
      ``{version: Listed}``; a version without an artifact is left out.

    Example:
      >>> import tempfile, jax, treeguard
      >>> from treeguard.examples import mlp
      >>> from treeguard.export import export_version
      >>> store = treeguard.ArtifactStore(tempfile.mkdtemp())
      >>> v1, v2 = (store.put(mlp.init(jax.random.key(seed))) for seed in (0, 1))
      >>> _ = export_version(mlp.model, store, v1)
      >>> store.verify(v1).status
      'verified'
      >>> {v: x.cell() for v, x in listed(store, store.versions()).items()} == {
      ...     v1: f"{jax.default_backend()} (jax {jax.__version__})"}
      True
    """
    found = {  # an unreadable record's row says so already
        v.version: store.peek_exported(v.version) for v in versions if v.status != "unreadable"
    }
    return {v: _one(v, *f) for v, f in found.items() if f is not None}


def _one(version: str, state: str, meta: dict[str, Any] | None) -> Listed:
    if meta is None:
        return Listed(state)
    try:
        description = Description.from_dict(meta, context=f"version {version}")
    except FormatError:  # covered by the verdict, and not a description this treeguard reads
        return Listed("unreadable")
    return Listed(state, description.platforms, description.jax)
