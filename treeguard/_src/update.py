"""Checked maps over several trees: same structure, same shapes, or an error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .diff import mismatches
from .errors import TreeMismatchError
from .mismatch import Mismatch
from .walk import flatten

_STRUCTURAL = frozenset(("missing", "unexpected", "node_type", "node_data"))


def _shape(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else np.shape(x)


def _dtype(x: Any) -> Any:
    dtype = getattr(x, "dtype", None)
    return dtype if dtype is not None else np.result_type(x)


def tree_map(
    f: Callable[..., Any],
    tree: Any,
    /,
    *rest: Any,
    shapes: bool = True,
    dtypes: bool = False,
) -> Any:
    """``jax.tree.map`` with a contract: every tree has exactly the first's
    structure (no prefix broadcasting) and, by default, the same leaf shapes.

    All trees are checked before ``f`` runs once, and every difference in
    every tree is reported together.

    Args:
      f: called with one leaf of each tree, as in ``jax.tree.map``.
      tree: the first tree; its structure is the contract.
      *rest: the other trees.
      shapes: require equal leaf shapes (default True).
      dtypes: require equal leaf dtypes (default False).

    Returns:
      A tree of the first tree's structure holding ``f``'s results.

    Raises:
      TreeMismatchError: listing each mismatch; the paths name the tree by
        its argument position.

    Example:
      >>> import jax.numpy as jnp
      >>> params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
      >>> grads = {"w": jnp.ones((2, 3)), "b": jnp.ones((2, 3))}
      >>> tree_map(lambda p, g: p - 0.01 * g, params, grads)
      Traceback (most recent call last):
      ...
      treeguard._src.errors.TreeMismatchError: 1 mismatch between tree 1 and tree 0:
        ['b']: shape (3,) in tree 0, (2, 3) in tree 1
      hint: an array of another shape would be broadcast or mis-assigned; fix it where it is built
    """
    leaves0, treedef = flatten(tree)
    flat = [leaves0]
    bad: list[int] = []
    for i, other in enumerate(rest, start=1):
        leaves, td = flatten(other)
        flat.append(leaves)
        if td != treedef or not _leaves_agree(leaves0, leaves, shapes=shapes, dtypes=dtypes):
            bad.append(i)
    if bad:
        _raise_for(tree, rest, bad, shapes=shapes, dtypes=dtypes)
    return treedef.unflatten([f(*xs) for xs in zip(*flat)])


def _leaves_agree(a: list[Any], b: list[Any], *, shapes: bool, dtypes: bool) -> bool:
    if shapes and any(_shape(x) != _shape(y) for x, y in zip(a, b)):
        return False
    return not (dtypes and any(_dtype(x) != _dtype(y) for x, y in zip(a, b)))


def _raise_for(
    tree: Any, rest: tuple[Any, ...], bad: list[int], *, shapes: bool, dtypes: bool
) -> None:
    keep = set(_STRUCTURAL)
    if shapes:
        keep |= {"shape", "dim"}
    if dtypes:
        keep.add("dtype")
    found: list[Mismatch] = []
    labels: list[str] = []
    for i in bad:
        ms = [m for m in mismatches(rest[i - 1], tree) if m.kind in keep]
        if not ms:
            ms = [Mismatch("", "node_data", "the first tree's treedef", "another treedef")]
        found += ms
        labels.append(f"tree {i}")
    raise TreeMismatchError(found, expected_from="tree 0", actual_from=" and ".join(labels))
