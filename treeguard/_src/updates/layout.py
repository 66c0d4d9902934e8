"""The trees of one call, flattened and labelled, and the checks of their
layout: cycles, leaves that are no arrays, structure and shapes against the
params, scalar hyperparameters."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..diff import mismatches
from ..errors import InvalidTreeError, TreeMismatchError
from ..mismatch import Mismatch
from ..paths import keystr
from ..spec import invalid_leaves_hint
from ..walk import assert_acyclic, flatten, invalid_leaves, structure_of

#: Mismatch kinds that make two trees incompatible for an update.
_LAYOUT = frozenset(("missing", "unexpected", "node_type", "node_data", "shape", "dim"))


def shape_of(x: Any) -> tuple[int, ...]:
    """A leaf's shape; Python numbers and numpy values have one too."""
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else np.shape(x)


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a value being traced by a JAX transformation."""
    return isinstance(x, jax.core.Tracer)


def mismatch_error(
    found: Sequence[Mismatch], *, expected_from: str, actual_from: str, hint: str | None = None
) -> TreeMismatchError:
    """A ``TreeMismatchError`` that ends with ``hint`` (or the guessed one)."""
    return TreeMismatchError(found, expected_from=expected_from, actual_from=actual_from, hint=hint)


@dataclasses.dataclass(frozen=True)
class LabelledTree:
    """The parts of one call the checks need: a label and the flat leaves."""

    label: str
    tree: Any
    leaves: list[Any]
    treedef: Any

    def paths(self) -> list[str]:
        return [keystr(p) for p in structure_of(self.tree, self.treedef).leaf_paths()]


def labelled_trees(labelled: Sequence[tuple[str, Any]]) -> list[LabelledTree]:
    """Flattens each ``(label, tree)`` for a check on the host."""
    out = []
    for label, tree in labelled:
        leaves, treedef = flatten(tree)
        out.append(LabelledTree(label, tree, leaves, treedef))
    return out


def check_acyclic(trees: Sequence[Any]) -> None:
    """Refuses a tree that contains itself before JAX flattens it."""
    for t in trees:
        assert_acyclic(t)


def _leaf_paths(lay: LabelledTree) -> list[Any]:
    return structure_of(lay.tree, lay.treedef).leaf_paths()


def check_arrays(layouts: Sequence[LabelledTree]) -> None:
    """Refuses leaves that are not arrays, in every tree at once."""
    problems: list[tuple[str, str]] = []
    for lay in layouts:
        found = invalid_leaves(lay.leaves, functools.partial(_leaf_paths, lay))
        problems += [(p, f"{d} (in {lay.label})") for p, d in found]
    if problems:
        hints = {invalid_leaves_hint(lay.tree) for lay in layouts}
        eqx = next((h for h in hints if "equinox" in h), None)  # save's hint for a module
        raise InvalidTreeError(
            problems,
            hint=eqx
            or "pass arrays only; hold config and Python objects outside the trees you update",
        )


def check_layout(ref: LabelledTree, others: Sequence[LabelledTree]) -> None:
    """Refuses trees whose structure or leaf shapes differ from ``ref``'s,
    listing every path in every tree before any arithmetic."""
    bad: list[LabelledTree] = []
    for lay in others:
        if lay.treedef != ref.treedef or any(
            shape_of(a) != shape_of(b) for a, b in zip(ref.leaves, lay.leaves)
        ):
            bad.append(lay)
    if not bad:
        return
    found: list[Mismatch] = []
    for lay in bad:
        ms = [m for m in mismatches(lay.tree, ref.tree) if m.kind in _LAYOUT]
        found += ms or [Mismatch("", "node_data", "the params' treedef", "another treedef")]
    raise mismatch_error(
        found,
        expected_from=ref.label,
        actual_from=" and ".join(lay.label for lay in bad),
        hint=None
        if any(m.kind != "shape" for m in found)
        else "an update of another shape would broadcast silently; build it with the "
        "params' shape (or reduce it to that shape on purpose)",
    )


def scalar_key(v: Any) -> Any:
    """What of a hyperparameter a compiled step depends on: its type or aval."""
    if isinstance(v, (bool, int, float, complex)):
        return type(v)
    aval = getattr(v, "aval", None)
    if aval is not None:
        return aval
    if isinstance(v, (np.ndarray, np.generic)):
        return ("numpy", np.shape(v), v.dtype)
    return ("invalid", type(v))


def check_scalars(scalars: dict[str, Any]) -> None:
    """Keyword arguments are hyperparameters: numbers or 0-d arrays."""
    bad_type = [
        (k, v)
        for k, v in scalars.items()
        if isinstance(scalar_key(v), tuple) and scalar_key(v)[0] == "invalid"
    ]
    if bad_type:
        raise InvalidTreeError(
            [
                (f"{k}=", f"keyword argument of type {type(v).__name__} is not a number or array")
                for k, v in bad_type
            ],
            hint="keyword arguments are scalar hyperparameters such as lr=0.01",
        )
    bad_shape = [(k, v) for k, v in scalars.items() if np.shape(v) != ()]
    if bad_shape:
        raise mismatch_error(
            [Mismatch(f"{k}=", "shape", (), tuple(np.shape(v))) for k, v in bad_shape],
            expected_from="a scalar hyperparameter",
            actual_from="the keyword arguments",
            hint="keyword arguments are passed to every leaf and must be scalars; pass a "
            "per-leaf value as a tree, positionally",
        )
