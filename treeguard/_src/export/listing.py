"""What each of a store's versions holds of an exported artifact, for a
listing (``treeguard store ls``): no JAX, nothing parsed but JSON.

A version holds an artifact once ``export`` attached one (the store logs
each attach as an ``export`` event). What a listing may say of it beyond
that comes through the same gate a server passes (``load_exported``: the
version verified, its verdict signed where the store has a key and covering
the artifact, every byte matching), so the platforms and the jax shown are
those of an artifact a server would take; otherwise the listing says why
not, as the gate's field names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ..errors import ArtifactError, FormatError, TreeguardError
from .description import Description

#: What an artifact's state says, for each state.
STATES = {
    "servable": "covered by the verdict, every byte matching: a server takes it",
    "unverified": "attached, and the version is not verified: verify it",
    "uncovered": "exported after the verdict: verify the version again",
    "changed": "its description or bytes changed since the verdict: do not serve it",
    "missing": "attached once, and gone since: do not serve it",
    "unreadable": "a description this treeguard cannot read (a newer format): upgrade it",
    "refused": "the version's own gate refuses it (its verdict's signature, say)",
}
#: ``ArtifactError.field`` as a state.
_FIELDS = {"verdict": "uncovered", "digest": "changed", "missing": "missing"}


@dataclasses.dataclass(frozen=True)
class Listed:
    """One version's artifact as a listing shows it.

    Attributes:
      state: one of ``STATES``.
      platforms: the platforms it was exported for (a ``servable`` one only).
      jax: the jax that wrote it (a ``servable`` one only).
    """

    state: str
    platforms: tuple[str, ...] = ()
    jax: str | None = None

    def cell(self) -> str:
        """The listing's cell: ``cpu, tpu (jax 0.10.2)``, else the state.

        Example:
          >>> Listed("servable", ("cpu", "tpu"), "0.10.2").cell(), Listed("uncovered").cell()
          ('cpu, tpu (jax 0.10.2)', 'uncovered')
        """
        if self.state != "servable":
            return self.state
        return f"{', '.join(self.platforms)} (jax {self.jax})"

    def as_json(self) -> dict[str, Any]:
        """``{"state", "platforms", "jax"}`` (the last two null unless servable)."""
        servable = self.state == "servable"
        return {
            "state": self.state,
            "platforms": list(self.platforms) if servable else None,
            "jax": self.jax if servable else None,
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
    attached = {e.version for e in store.history() if e.action == "export"}
    return {v.version: _one(store, v) for v in versions if v.version in attached}


def _one(store: Any, info: Any) -> Listed:
    if info.status != "verified":
        return Listed("unverified")
    try:
        meta, _ = store.load_exported(info.version)
        description = Description.from_dict(meta, context=f"version {info.version}")
    except ArtifactError as e:
        return Listed(_FIELDS.get(e.field, "changed"))
    except FormatError:  # covered by the verdict, and not a description this treeguard reads
        return Listed("unreadable")
    except TreeguardError:  # not verified after all, a forged verdict: the gate's refusal
        return Listed("refused")
    return Listed("servable", description.platforms, description.jax)
