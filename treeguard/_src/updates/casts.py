"""Dtypes under a policy: which leaves differ from their param's, which casts
are allowed, and the record of each cast done."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..leaf import is_inexact
from ..mismatch import Mismatch
from .layout import LabelledTree, mismatch_error
from .policy import Cast, DtypePolicy

_CAST_HINT = (
    'pass dtype_policy="cast" to cast on purpose (each cast is reported), '
    "or fix the dtype where {what} are built"
)
_INT_HINT = (
    "integer or bool params cannot take a float or complex update; leave them out of the "
    "update (e.g. optax.masked) or keep them outside the params"
)


def leaf_dtype(x: Any) -> np.dtype[Any]:
    """A leaf's dtype by JAX's rules (a Python float is float32 unless x64)."""
    return np.dtype(jnp.result_type(x))


def same_kind(source: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether ``source`` may be cast to ``target`` without changing kind
    (float to float, int to float; never float to int)."""
    return bool(jnp.can_cast(source, target, casting="same_kind"))


def plan_casts(
    ref: LabelledTree, others: Sequence[LabelledTree], policy: DtypePolicy
) -> tuple[dict[tuple[int, int], np.dtype[Any]], list[Cast]]:
    """Compares every leaf's dtype with its param's under ``policy``.

    Returns:
      ``{(tree index, leaf index): target dtype}`` for the casts to do, and
      their ``Cast`` records.

    Raises:
      TreeMismatchError: under ``"strict"`` for any dtype that differs, and
        under ``"cast"`` for a cast that would change the kind (float to int).
    """
    ref_dtypes = [leaf_dtype(x) for x in ref.leaves]
    differ = [
        (j, i, leaf_dtype(x), ref_dtypes[i])
        for j, lay in enumerate(others)
        for i, x in enumerate(lay.leaves)
        if leaf_dtype(x) != ref_dtypes[i]
    ]
    if not differ:
        return {}, []
    paths = ref.paths()
    refused = [d for d in differ if policy == "strict" or not same_kind(d[2], d[3])]
    if refused:
        found = [Mismatch(paths[i], "dtype", t.name, s.name) for _, i, s, t in refused]
        labels = sorted({others[j].label for j, *_ in refused})
        what = " and ".join(labels).removeprefix("the ")
        if any(not is_inexact(t) and is_inexact(s) for _, _, s, t in refused):
            hint = _INT_HINT
        elif policy == "strict":
            hint = _CAST_HINT.format(what=what)
        else:
            hint = (
                f"these casts would change the kind of number; fix the dtype where {what} are built"
            )
        raise mismatch_error(
            found, expected_from=ref.label, actual_from=" and ".join(labels), hint=hint
        )
    plan = {(j, i): t for j, i, _, t in differ}
    casts = [Cast(paths[i], s.name, t.name, others[j].label) for j, i, s, t in differ]
    return plan, casts
