"""``treeguard.export``: serve a model without its Python code.

``export_version`` exports a model's serving function with ``jax.export``
(the batch axis symbolic), checks it against the live model on the model's
cases at its tolerance, and keeps it beside a store's version: hashed with
BLAKE3, described (inputs, outputs, platforms, the jax that wrote it, the
calling convention), and covered by the version's next verdict and its
signature. ``served_from_store`` reads it back through the store's gates
for ``Server`` (``treeguard serve --store STORE`` does this), and its
``check`` refuses, at start and on every swap, an artifact that is missing,
changed, uncovered, or written for another jax or platform.

It needs the ``export`` extra (``flatbuffers``, which ``jax.export`` uses
to serialize). Its errors (``ExportError``, ``ExportValidationError``,
``ArtifactError``) are ``treeguard``'s.
"""

from .._src.export.api import ExportResult as ExportResult
from .._src.export.api import export_version as export_version
from .._src.export.description import Description as Description
from .._src.export.served import Served as Served
from .._src.export.served import served_from_store as served_from_store

__all__ = [
    "Description",
    "ExportResult",
    "Served",
    "export_version",
    "served_from_store",
]
