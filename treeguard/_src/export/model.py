"""A ``Model`` made from an exported artifact: served without its Python code.

The server takes a ``treeguard.verify.Model``; ``artifact_model`` makes one
whose ``apply`` calls the artifact's function and whose params contract is
the artifact's params spec. The params are the version's checkpoint, loaded
into that spec's structure: custom nodes (an nnx ``State``, an equinox
module) come back as plain containers, since their classes are not
imported, and ``apply`` hands the function their leaves in the stored
structure's flatten order (``plain_leaves``), the order it was exported
with. ``init`` gives zeros in that structure (the server traces it for the
structure only); ``loss`` refuses: an artifact serves, it does not train.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..checkpoint.restore import plain, plain_leaves
from ..errors import ConfigError, InvalidRequestError
from ..serving.buckets import bucket_for
from ..serving.spec import ServingSpec
from ..verify.model import Model
from .description import Description


def artifact_model(
    description: Description, table: dict[int | None, Any], spec: ServingSpec
) -> Model:
    """The ``Model`` that serves an artifact with a version's params.

    Args:
      description: the artifact's description.
      table: its ``jax.export.Exported`` parts by batch size (``compat.deserialize``).
      spec: the serving spec it is served under (its inputs are the artifact's).

    Returns:
      A ``Model`` whose ``apply(params, batch)`` runs the artifact.
    """
    structure = description.params.structure
    shapes = [(tuple(int(d) for d in leaf.shape), leaf.dtype) for leaf in description.params.leaves]

    def init(_key: jax.Array) -> Any:
        return plain(structure, iter(jnp.zeros(s, d) for s, d in shapes))

    def apply(params: Any, batch: Any) -> Any:
        leaves = jax.tree.leaves(batch)
        args = plain_leaves(structure, params)
        if None in table:
            return table[None].call(args, leaves)
        return run_bucket(table, args, leaves)

    def loss(_params: Any, _batch: Any) -> Any:
        raise ConfigError(
            f"model {description.model!r} is served from its exported artifact, which holds "
            "its serving function only; it has no loss",
            hint="train and verify with the model's Python code (MODULE:ATTR)",
        )

    return Model(
        init=init,
        apply=apply,
        loss=loss,
        batch_spec=spec.inputs,
        rtol=description.rtol,
        atol=description.atol,
        params_spec=description.params,
        name=description.model,
    )


def run_bucket(table: dict[int | None, Any], params: list[Any], leaves: list[Any]) -> Any:
    """The part of ``table`` for ``leaves``' rows (a traced batch's size is
    known), on ``leaves`` padded with zero rows to its bucket, the outputs
    sliced back to the rows.

    Raises:
      InvalidRequestError: for more rows than the largest bucket.
    """
    rows = int(leaves[0].shape[0])
    sizes = sorted(k for k in table if k is not None)
    bucket = bucket_for(rows, sizes)
    if bucket is None:
        raise InvalidRequestError(
            f"{rows} rows, more than the largest batch the artifact was exported for ({sizes[-1]})"
        )
    if bucket == rows:
        return table[bucket].call(params, leaves)
    padded = [jnp.pad(x, [(0, bucket - rows)] + [(0, 0)] * (x.ndim - 1)) for x in leaves]
    return jax.tree.map(lambda y: y[:rows], table[bucket].call(params, padded))
