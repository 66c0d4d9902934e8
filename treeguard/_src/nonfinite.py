"""NaN and Inf in a tree: which leaves hold them and how many, in one dispatch.

The counting is plain traceable JAX (``jnp.isfinite`` and a sum per leaf), so
it runs inside ``jit`` and ``vmap``. Outside a transformation, every leaf is
counted in one compiled call and read back in one transfer. Key-path text is
built only for the leaves that hold a non-finite value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InvalidTreeError, TracedValueError
from .leaf import summarize
from .paths import keystr
from .spec import record_of
from .walk import flatten, invalid_leaves, structure_of

#: How many leaves an error lists before it says how many it left out.
_LISTED = 20


def is_inexact(dtype: Any) -> bool:
    """Whether a dtype can hold NaN or Inf (floating and complex dtypes).

    Example:
      >>> is_inexact(jnp.bfloat16), is_inexact(jnp.int8)
      (True, False)
    """
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def count_leaf(x: Any) -> jax.Array:
    """The number of NaN and Inf values in one array, as a traceable int32 scalar."""
    if not is_inexact(jnp.result_type(x)):
        return jnp.zeros((), jnp.int32)
    return jnp.sum(~jnp.isfinite(x), dtype=jnp.int32)


def host_nonfinite(x: Any) -> int:
    """The number of NaN and Inf values of a host value (a numpy array or
    scalar, a Python number), counted at its own dtype: a numpy f64 stays
    f64, where JAX without x64 would cast it to f32 and a finite 1e40 to Inf.

    Example:
      >>> host_nonfinite(np.float64(1e40)), host_nonfinite([np.nan, 1e300, np.inf])
      (0, 2)
    """
    arr = np.asarray(x)
    if arr.dtype.kind not in "fc":
        if not is_inexact(arr.dtype):
            return 0
        arr = arr.astype(np.float32)  # bfloat16 and the other ml_dtypes floats
    return int(np.count_nonzero(~np.isfinite(arr)))


#: Leaves per compiled counting call: one reduction per leaf compiles in time
#: that grows faster than the leaf count, so long trees are counted in chunks.
_CHUNK = 256


def all_finite(leaves: Sequence[Any]) -> jax.Array:
    """Whether every value of every leaf is finite, as one traceable bool.

    Leaves of one dtype are raveled and joined, so the check is one fused
    reduction per dtype however many leaves there are. A leaf sharded over
    Explicit mesh axes is reduced on its own: its sharding is part of its
    type, and JAX refuses to ravel or join it with leaves laid out otherwise.
    """
    groups: dict[Any, list[Any]] = {}
    ok = jnp.asarray(True)
    for x in leaves:
        dtype = jnp.result_type(x)
        if not is_inexact(dtype):
            continue
        if typed_sharding(x):
            ok = jnp.logical_and(ok, jnp.all(jnp.isfinite(x)))
        else:
            groups.setdefault(dtype, []).append(jnp.ravel(x))
    for xs in groups.values():
        joined = xs[0] if len(xs) == 1 else jnp.concatenate(xs)
        ok = jnp.logical_and(ok, jnp.all(jnp.isfinite(joined)))
    return ok


def typed_sharding(x: Any) -> bool:
    """Whether a leaf's type names mesh axes (it is sharded over Explicit axes)."""
    if not isinstance(x, jax.Array):  # numpy arrays and Python numbers
        return False
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    return spec is not None and any(e is not None for e in spec)


_all_finite = jax.jit(all_finite)


@jax.jit
def _count_each(leaves: list[Any]) -> list[jax.Array]:
    return [count_leaf(x) for x in leaves]


def _leaves_of(tree: Any) -> tuple[list[Any], Any]:
    leaves, treedef = flatten(tree)
    bad = invalid_leaves(leaves, lambda: structure_of(tree, treedef).leaf_paths())
    if bad:
        raise InvalidTreeError(
            bad, hint="keep only arrays in the tree; hold config in static fields"
        )
    return leaves, treedef


def count_nonfinite(tree: Any, /) -> Any:
    """Counts the NaN and Inf values of every leaf; works inside ``jit`` and ``vmap``.

    Args:
      tree: a pytree of arrays. Integer and bool leaves count 0.

    Returns:
      A tree of the same structure holding one int32 scalar per leaf. Reduce
      it with ``sum(jax.tree.leaves(...))`` for a total.

    Raises:
      InvalidTreeError: for a cyclic tree or a leaf that is not an array.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> grads = {"w": jnp.array([1.0, jnp.nan, jnp.inf]), "step": jnp.array(3)}
      >>> jax.jit(count_nonfinite)(grads)["w"]
      Array(2, dtype=int32)
    """
    leaves, treedef = _leaves_of(tree)
    counts: list[Any] = []
    for i in range(0, len(leaves), _CHUNK):
        counts += _count_each(leaves[i : i + _CHUNK])
    return treedef.unflatten(counts)


def find_nonfinite(tree: Any, /) -> dict[str, int]:
    """Names every leaf that holds NaN or Inf, with how many such values it has.

    One fused reduction per dtype answers whether anything is non-finite;
    only then are the leaves counted one by one and their key paths built.
    Host values (numpy arrays, Python numbers) are counted with numpy at
    their own dtype, as JAX without x64 would make a finite f64 1e300 Inf. Inside ``jit`` use
    ``count_nonfinite``, which returns the counts as traceable arrays.

    Args:
      tree: a pytree of concrete arrays.

    Returns:
      ``{path: count}`` for each leaf with at least one NaN or Inf, in flatten
      order; empty when every value is finite.

    Raises:
      InvalidTreeError: for a cyclic tree or a leaf that is not an array.
      TracedValueError: when called inside a JAX transformation.

    Example:
      >>> import jax.numpy as jnp
      >>> grads = {"dense1": {"w": jnp.array([[1.0, jnp.nan]]), "b": jnp.zeros(2)},
      ...          "dense2": {"w": jnp.array([jnp.inf, -jnp.inf])}}
      >>> find_nonfinite(grads)
      {"['dense1']['w']": 1, "['dense2']['w']": 2}
      >>> find_nonfinite({"w": jnp.ones(3)})
      {}
    """
    leaves, treedef = _leaves_of(tree)
    if not leaves:
        return {}
    # host values are counted at their own dtype (``host_nonfinite``), arrays by JAX
    counts = [0 if isinstance(x, jax.Array) else host_nonfinite(x) for x in leaves]
    on_device = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    arrays = [leaves[i] for i in on_device]
    try:
        ok = _all_finite(arrays) if arrays else True
    except (ValueError, TypeError):
        # leaves on meshes JAX will not combine in one program (axes of other
        # types): count them one by one below, which needs no combining
        ok = False
    if isinstance(ok, jax.core.Tracer):
        raise TracedValueError(
            "find_nonfinite needs concrete arrays but was called inside a JAX transformation; "
            "hint: use treeguard.count_nonfinite(tree) inside jit, it returns traceable counts"
        )
    if ok and not any(counts):
        return {}
    if not ok:
        for start in range(0, len(arrays), _CHUNK):
            # one transfer per chunk, without joining counts that may live on different meshes
            chunk = np.asarray(jax.device_get(_count_each(arrays[start : start + _CHUNK])))
            for i in np.flatnonzero(chunk):
                counts[on_device[start + i]] = int(chunk[i])
    paths = structure_of(tree, treedef).leaf_paths()
    return {keystr(paths[i]): c for i, c in enumerate(counts) if c}


def describe_counts(
    counts: Mapping[str, int],
    leaves: Sequence[Any],
    paths: Sequence[str],
    *,
    where: str,
    hint: str,
) -> str:
    """The message of a ``NonFiniteError``: a head line, one line per leaf, a hint."""
    index = {p: i for i, p in enumerate(paths)}
    n = len(counts)
    lines = [f"{n} {'leaf holds' if n == 1 else 'leaves hold'} NaN or Inf in {where}:"]
    for path, c in list(counts.items())[:_LISTED]:
        x = leaves[index[path]] if path in index else None
        size = int(np.prod(np.shape(x))) if x is not None else None
        what = ""
        if x is not None:
            shape, dtype, *_ = record_of(x)
            what = f" ({summarize(shape, dtype)})"
        of = f" of {size}" if size is not None else ""
        noun = "value" if (size if size is not None else c) == 1 else "values"  # 1 of 2 values
        lines.append(f"  {path or '<root>'}: {c}{of} {noun}{what}")
    if n > _LISTED:
        lines.append(f"  ... and {n - _LISTED} more")
    lines.append(f"hint: {hint}")
    return "\n".join(lines)
