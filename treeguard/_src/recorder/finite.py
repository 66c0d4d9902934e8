"""The recorder's finiteness check, traced into the step: one bool for every
value of the loss, the grads, the new params and the new state, each leaf
read once, and the loss that carries it (NaN unless every leaf is finite),
so that one scalar read a step tells both."""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ..leaf import is_inexact
from ..nonfinite import all_finite, typed_sharding

#: Up to this many leaves, each leaf is reduced on its own; beyond it, the
#: leaves of a dtype are joined first (``all_finite``), which compiles faster.
PER_LEAF = 256


#: Leaves of at least this many values, of a dtype in ``_BY_PRODUCT``, are
#: checked by a product with zeros rather than by a sum.
PRODUCT_MIN = 4096

#: The dtypes XLA multiplies as they are: on the CPU a matrix-vector product
#: reads an f32 leaf in about a third of the CPU time of a sum of ``x - x``.
#: Half-precision leaves would be converted to f32 first, a pass more.
_BY_PRODUCT = frozenset(
    jnp.dtype(d) for d in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128)
)

#: The longest and the shortest row of the matrix a leaf is viewed as for the
#: product; a leaf whose size has no power-of-two factor that long is summed.
_ROW = 512
_ROW_MIN = 64


def _accumulator(dtype: Any) -> Any:
    wide = jnp.issubdtype(dtype, jnp.complexfloating) or dtype.itemsize > 4
    return dtype if wide else jnp.float32


@functools.cache
def _holds_zero(dtype: Any) -> bool:
    """Whether ``dtype`` has a zero (``float8_e8m0fnu`` has none: its ``x - x`` is NaN)."""
    return bool(np.asarray(0, np.float32).astype(dtype) == 0)


def _subtractable(x: jax.Array) -> jax.Array:
    """``x``, or ``x`` as float32 where its dtype has no zero, so that ``x - x``
    is 0 for every finite value."""
    return x if _holds_zero(x.dtype) else x.astype(jnp.float32)


def _finite_sum(x: jax.Array) -> jax.Array:
    """0 when every value of ``x`` is finite, NaN otherwise, in one pass.

    ``x - x`` is exactly 0 for a finite value and NaN for NaN or an
    infinity, and a sum of zeros stays 0 while a NaN stays NaN, so the
    sum is exact where a sum of ``x`` itself could overflow.
    """
    x = _subtractable(x)
    return jnp.sum(x - x, dtype=_accumulator(x.dtype))


#: How ``_marks`` reads a leaf: as on the CPU; in its own shape, for the leaves
#: of a shape to be added first (one accelerator); each leaf summed on its own.
MarkWay = Literal["cpu", "shape", "leaf"]


def _mark_way() -> MarkWay:
    if jax.default_backend() == "cpu":
        return "cpu"
    return "shape" if jax.device_count() == 1 else "leaf"


def _marks(x: Any, way: MarkWay) -> jax.Array:
    """An array of zeros and NaNs that is all zeros when every value of ``x`` is
    finite.

    On the CPU (``way="cpu"``), a vector: a large leaf of a dtype in
    ``_BY_PRODUCT`` is viewed (without a copy) as a matrix with rows of up to
    ``_ROW`` values and multiplied by a vector of zeros: each product
    ``v * 0`` is 0 for a finite ``v`` and NaN for NaN or an infinity (a
    complex one too: both parts of ``v * (0 + 0j)`` are sums of such
    products), and a row's sum of them is 0 or NaN, with nothing to
    overflow; a small leaf is marked value by value. On an accelerator with
    one device (``"shape"``), ``x - x`` in the leaf's own shape: the leaves of a shape are
    added value by value and reduced in one fused pass (a reduction per leaf
    would be a kernel per leaf, each launched while the host waits for the
    step). A leaf sharded over Explicit mesh axes is
    summed as it is (its sharding is part of its type, and JAX refuses to
    reshape it), as is one of another dtype or with no long row, and every
    leaf on several accelerators (``"leaf"``: leaves of a shape may lie
    differently, and adding them would move one).
    """
    x = jnp.asarray(x)
    if typed_sharding(x):
        return _finite_sum(x).reshape(1)
    # an accelerator fuses the sum into one pass at its memory's speed,
    # where a product at "highest" precision takes several passes
    if way == "shape":
        x = _subtractable(x)
        return jnp.subtract(x, x)
    if way == "leaf":
        return _finite_sum(x).reshape(1)
    if x.size < PRODUCT_MIN:
        flat = jnp.ravel(x).astype(_accumulator(x.dtype))
        return flat - flat
    row = math.gcd(x.size, _ROW)
    if x.dtype in _BY_PRODUCT and row >= _ROW_MIN:
        zeros = jnp.zeros(row, x.dtype)
        # at full precision: a product rounded to bf16 would take f32's largest to Inf
        return jnp.dot(
            x.reshape(-1, row), zeros, precision="highest", preferred_element_type=x.dtype
        )
    return _finite_sum(x).reshape(1)


def finite_flag(leaves: list[Any], *, way: MarkWay | None = None) -> jax.Array:
    """Whether every value of every leaf is finite, as one traceable bool.

    Each floating or complex leaf gives an array of zeros and NaNs
    (``_marks``); the arrays of one dtype and shape are added up and each
    sum reduced, so a step whose leaves share a few shapes costs one read of
    each large leaf, a few reductions and no copy.

    Args:
      leaves: the arrays to check.
      way: how each leaf is read (``_marks``); by default, by JAX's default
        backend and its number of devices.

    Returns:
      A bool scalar.

    Example:
      >>> import jax.numpy as jnp
      >>> bool(finite_flag([jnp.ones(3), jnp.array(jnp.nan), jnp.arange(2)]))
      False
      >>> bool(finite_flag([jnp.full(4, jnp.finfo(jnp.float32).max), jnp.arange(2)]))
      True
    """
    if len(leaves) > PER_LEAF:
        return all_finite(leaves)
    how = _mark_way() if way is None else way
    added: dict[tuple[Any, tuple[int, ...]], jax.Array] = {}
    for x in leaves:
        if is_inexact(jnp.result_type(x)):
            marks = _marks(x, how)
            key = (marks.dtype, marks.shape)
            added[key] = added[key] + marks if key in added else marks
    ok = jnp.asarray(True)
    for marks in added.values():
        ok = jnp.logical_and(ok, jnp.isfinite(jnp.sum(marks)))
    return ok


def _holds_nan(dtype: Any) -> bool:
    """Whether a float dtype can hold NaN (float4 and some float8 kinds
    cannot: NaN becomes a finite value there, which would pass for a flag)."""
    return bool(np.isnan(np.asarray(np.nan).astype(dtype).astype(np.float32)))


def carried(loss: Any, ok: jax.Array) -> jax.Array | None:
    """The loss with the step's finiteness flag folded in, traced: the loss
    where every checked leaf is finite, NaN where one is not; so one scalar
    read tells both (finite exactly when the flag is set, the loss itself
    being checked). None for a loss that is not a real floating scalar of
    a dtype that can hold NaN: the flag is read then.

    Example:
      >>> float(carried(jnp.float32(2.5), jnp.bool_(True)))
      2.5
      >>> float(carried(jnp.float32(2.5), jnp.bool_(False)))
      nan
      >>> carried(jnp.arange(3.0), jnp.bool_(True)) is None
      True
    """
    if not carries(loss):
        return None
    return jnp.where(ok, loss, jnp.full_like(loss, jnp.nan))  # keeps a weak type


def carries(loss: Any) -> bool:
    """Whether ``loss`` (an array, or its ``jax.ShapeDtypeStruct``) can carry a
    flag: a real floating scalar of a dtype that can hold NaN.

    Example:
      >>> carries(jnp.float32(1.0)), carries(jnp.arange(3.0)), carries(jnp.int32(1))
      (True, False, False)
    """
    dtype = getattr(loss, "dtype", None)
    if getattr(loss, "shape", None) != () or dtype is None:
        return False
    return bool(jnp.issubdtype(dtype, jnp.floating) and _holds_nan(jnp.dtype(dtype)))
