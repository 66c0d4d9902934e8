"""A checked ``jax.tree.map``: every tree has exactly the first's structure and,
by default, its leaf shapes, or an error lists every path that differs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ..diff import mismatches
from ..errors import TreeMismatchError
from ..mismatch import Mismatch
from ..paths import keystr
from ..walk import flatten, structure_of
from .layout import shape_of
from .shardings import refused_layout, sharding_refused

_STRUCTURAL = frozenset(("missing", "unexpected", "node_type", "node_data"))


def _dtype(x: Any) -> Any:
    dtype = getattr(x, "dtype", None)
    # JAX's rule for Python scalars (float -> float32 unless x64), as specs record them.
    return dtype if dtype is not None else jax.numpy.result_type(x)


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
      treeguard.TreeMismatchError: 1 mismatch between tree 1 and tree 0:
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
    out: list[Any] = []
    for i, xs in enumerate(zip(*flat)):
        try:
            out.append(f(*xs))
        except Exception as e:
            if not refused_layout(e):
                raise
            path = keystr(structure_of(tree, treedef).leaf_paths()[i])
            raise sharding_refused(e, [(path, x, f"tree {j}") for j, x in enumerate(xs)]) from e
    return treedef.unflatten(out)


def _leaves_agree(a: list[Any], b: list[Any], *, shapes: bool, dtypes: bool) -> bool:
    if shapes and any(shape_of(x) != shape_of(y) for x, y in zip(a, b)):
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
