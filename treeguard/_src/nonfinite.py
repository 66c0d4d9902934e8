"""NaN and Inf in a tree: which leaves hold them and how many, in one dispatch.

The counting is plain traceable JAX (``jnp.isfinite`` and a sum per leaf), so
it runs inside ``jit`` and ``vmap``. Outside a transformation, every leaf is
counted in one compiled call and read back in one transfer. Key-path text is
built only for the leaves that hold a non-finite value.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .errors import InvalidTreeError, TracedValueError
from .leaf import is_inexact, summarize
from .paths import keystr
from .spec import record_of
from .walk import flatten, invalid_leaves, structure_of

#: How many leaves an error lists before it says how many it left out.
_LISTED = 20


def count_leaf(x: Any) -> jax.Array:
    """The number of NaN and Inf values in one array, as a traceable int32 scalar."""
    if not is_inexact(jnp.result_type(x)):
        return jnp.zeros((), jnp.int32)
    return jnp.sum(~jnp.isfinite(x), dtype=jnp.int32)


#: Host arrays are checked this many elements at a time, so the check's
#: scratch memory (one bool per element) stays small beside a large leaf.
_BLOCK = 1 << 22

#: Up to this many elements, ``host_all_finite`` checks an array's values in Python.
SMALL = 64


def _host_array(x: Any) -> np.ndarray[Any, Any] | None:
    """``x`` as a numpy array at its own dtype, or None when it cannot hold NaN or Inf."""
    arr = np.asarray(x)
    return arr if is_inexact(arr.dtype) else None


def _blocks(arr: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
    flat = arr.ravel(order="K")  # a view of a contiguous array
    for start in range(0, flat.size, _BLOCK):
        yield flat[start : start + _BLOCK]


#: bfloat16's exponent bits: all set for Inf and NaN alone (it is IEEE-like).
_BF16_EXPONENT = np.uint16(0x7F80)
_BF16 = np.dtype(ml_dtypes.bfloat16)
#: Up to this many values of an ml_dtypes float, a cast to float32 is the cheapest check.
_CAST = 4096


def _count(block: np.ndarray[Any, Any]) -> int:
    """The non-finite values of one block of an inexact dtype."""
    if block.size <= _CAST and block.dtype.kind == "V":  # a few ml_dtypes values: cast
        return block.size - int(np.count_nonzero(np.isfinite(block.astype(np.float32))))
    if block.dtype == _BF16:  # its bits: several times numpy's ufunc, and no cast
        bits = block.view(np.uint16) & _BF16_EXPONENT
        return int(np.count_nonzero(bits == _BF16_EXPONENT))
    return block.size - int(np.count_nonzero(np.isfinite(block)))


def host_nan_inf(x: Any) -> tuple[int, int]:
    """The number of NaN and of Inf values of a host value (a numpy array or
    scalar, a Python number), at its own dtype; ``(0, 0)`` for other kinds.

    Example:
      >>> import ml_dtypes
      >>> host_nan_inf(np.array([np.nan, np.inf, -np.inf, 1.0], ml_dtypes.bfloat16))
      (1, 2)
    """
    arr = _host_array(x)
    if arr is None:
        return 0, 0
    nan = inf = 0
    for block in _blocks(arr):
        nan += int(np.count_nonzero(np.isnan(block)))
        inf += int(np.count_nonzero(np.isinf(block)))
    return nan, inf


def host_nonfinite(x: Any) -> int:
    """The number of NaN and Inf values of a host value (a numpy array or
    scalar, a Python number), counted at its own dtype: a numpy f64 stays
    f64, where JAX without x64 would cast it to f32 and a finite 1e40 to Inf.

    Every float kind is counted (``leaf.is_inexact``: bfloat16 and each
    float8 included, with no cast), a block of elements at a time.

    Example:
      >>> host_nonfinite(np.float64(1e40)), host_nonfinite([np.nan, 1e300, np.inf])
      (0, 2)
    """
    arr = _host_array(x)
    return 0 if arr is None else _count_all(arr)


def _count_all(arr: np.ndarray[Any, Any]) -> int:
    if arr.size <= _BLOCK:
        return _count(arr)
    return sum(_count(block) for block in _blocks(arr))


def host_all_finite(x: np.ndarray[Any, Any]) -> bool:
    """Whether every element of a host array of any float kind (bfloat16,
    float8 and complex included) is finite; True for other kinds.

    The check every gate runs on host arrays: a version's params at load,
    a served response's outputs, the release checks. A response's few
    values are read as Python floats, several times cheaper than a ufunc's
    dispatch between requests.

    Example:
      >>> import ml_dtypes
      >>> host_all_finite(np.array([1.0, np.inf])), host_all_finite(np.array([1, 2]))
      (False, True)
      >>> host_all_finite(np.array([1.0, np.nan], ml_dtypes.float8_e4m3fn))
      False
    """
    dtype = x.dtype
    kind = dtype.kind
    if kind in "fc" or (kind == "V" and is_inexact(dtype)):
        if kind == "f" and x.size <= SMALL and dtype.itemsize <= 8:
            # exact, up to float64: every narrower float converts to a Python float
            return all(map(math.isfinite, x.ravel().tolist()))
        return _count_all(x) == 0
    return True


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
    hint: str | None = None,
) -> str:
    """The message of a ``NonFiniteError``: a head line, one line per leaf
    (its path, count, dtype and shape), then the hint when one is given."""
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
    if hint is not None:
        lines.append(f"hint: {hint}")
    return "\n".join(lines)


def describe_nonfinite(tree: Any, /, *, where: str) -> str | None:
    """Names each leaf of a concrete tree that holds NaN or Inf, of any float
    kind (bfloat16 and float8 included), with its count, dtype and shape.

    Args:
      tree: a pytree of concrete arrays (numpy arrays are checked at their
        own dtype).
      where: what the tree is, for the head line (``"the params"``).

    Returns:
      The text (no hint), or None when every value is finite.

    Raises:
      InvalidTreeError: for a cyclic tree or a leaf that is not an array.

    Example:
      >>> import ml_dtypes
      >>> print(describe_nonfinite({"w": np.array([1, np.nan], ml_dtypes.bfloat16)}, where="v1"))
      1 leaf holds NaN or Inf in v1:
        ['w']: 1 of 2 values (bf16[2])
      >>> describe_nonfinite({"w": np.ones(2, np.float32)}, where="v1") is None
      True
    """
    counts = find_nonfinite(tree)
    if not counts:
        return None
    leaves, treedef = _leaves_of(tree)
    paths = [keystr(p) for p in structure_of(tree, treedef).leaf_paths()]
    return describe_counts(counts, leaves, paths, where=where)
