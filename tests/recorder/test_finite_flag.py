"""The recorder's one finiteness check: every way it reads a leaf (a product
with zeros, a sum of ``x - x``, marks value by value) finds a single NaN or
Inf anywhere, and passes every finite value up to its dtype's largest."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P
from machine import cpu_devices, cpu_mesh

import treeguard as tg

# The traced finite flag alone, on purpose: each way it marks a leaf, at sizes
# around its threshold, with no recorder and no step around it.
from treeguard._src.recorder.finite import (  # _src: the in-jit finite flag's bounds
    PRODUCT_MIN,
    _marks,
    finite_flag,
)

#: One leaf for each way a leaf is checked, every value at its dtype's largest
#: (alternating in sign), so that a sum of the values themselves would overflow.
SHAPES = {
    "f32 product, 2-d": ((64, 64), jnp.float32),
    "f32 product, 3-d": ((4, 32, 48), jnp.float32),
    "f32 product, same shape": ((64, 64), jnp.float32),
    "c64 product": ((128, 64), jnp.complex64),
    "f32 sum, rows too short": ((4128,), jnp.float32),
    "f32 sum, odd size": ((4099,), jnp.float32),
    "bf16 sum": ((64, 64), jnp.bfloat16),
    "f16 sum": ((4, 1024), jnp.float16),
    "f32 small": ((5, 7), jnp.float32),
    "bf16 small": ((3,), jnp.bfloat16),
    "f16 small": ((512,), jnp.float16),
    "c64 small": ((10,), jnp.complex64),
    "f32 scalar": ((), jnp.float32),
}


def _largest(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    top = float(jnp.finfo(dtype).max)
    signs = np.where(np.arange(int(np.prod(shape))) % 2 == 0, 1.0, -1.0).reshape(shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return np.asarray(signs * top * (1 - 1j), dtype)  # both parts at the largest
    return np.asarray(signs * top, dtype)


def _poisons(dtype: Any) -> list[Any]:
    bad: list[Any] = [np.nan, np.inf, -np.inf]
    if jnp.issubdtype(dtype, jnp.complexfloating):
        bad += [complex(0.0, np.inf), complex(np.nan, 0.0), complex(1.0, -np.inf)]
    return bad


def _cases(leaves: list[np.ndarray]) -> Iterator[tuple[int, Any, int]]:
    """(leaf, poison, flat index) for a poison at the first, middle and last value."""
    for i, x in enumerate(leaves):
        for bad in _poisons(x.dtype):
            for at in sorted({0, x.size // 2, x.size - 1}):
                yield i, bad, at


def _poisoned(leaves: list[np.ndarray], i: int, bad: Any, at: int) -> list[np.ndarray]:
    out = list(leaves)
    out[i] = leaves[i].copy()
    out[i].reshape(-1)[at] = bad
    return out


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_way_of_checking_a_leaf_is_taken_where_the_shapes_say(name: str) -> None:
    shape, dtype = SHAPES[name]
    jaxpr = str(jax.make_jaxpr(lambda x: _marks(x, "cpu"))(jnp.zeros(shape, dtype)))
    assert ("dot_general" in jaxpr) == ("product" in name), jaxpr
    assert ("reduce_sum" in jaxpr) == ("sum" in name), jaxpr
    assert (int(np.prod(shape)) >= PRODUCT_MIN) == ("small" not in name and "scalar" not in name)


@pytest.mark.parametrize("name", list(SHAPES))
def test_an_accelerator_marks_each_leaf_in_its_own_shape_to_add_leaves_of_a_shape(
    name: str,
) -> None:
    shape, dtype = SHAPES[name]
    jaxpr = jax.make_jaxpr(lambda x: _marks(x, "shape"))(jnp.zeros(shape, dtype))
    assert [e.primitive.name for e in jaxpr.eqns] == ["sub"], jaxpr
    assert jaxpr.out_avals[0].shape == shape


# "leaf": a sum for each of the 6 leaves, then one of their 6 sums
@pytest.mark.parametrize(("way", "reductions"), [("shape", 3), ("leaf", 7)])
def test_one_accelerator_reduces_the_leaves_of_a_shape_together_several_each_leaf(
    way: Any, reductions: int
) -> None:
    leaves = [jnp.zeros(s) for s in [(64, 64), (64, 64), (8,), (64, 64), (8,), ()]]
    jaxpr = str(jax.make_jaxpr(lambda xs: finite_flag(xs, way=way))(leaves))
    assert jaxpr.count("reduce_sum") == reductions, jaxpr


@pytest.mark.parametrize("way", ["cpu", "shape", "leaf"])
def test_one_nan_or_inf_anywhere_in_any_leaf_makes_the_flag_false(way: Any) -> None:
    leaves = [_largest(shape, dtype) for shape, dtype in SHAPES.values()]
    leaves.append(np.arange(4096, dtype=np.int32))  # not checked: it cannot hold NaN
    check = jax.jit(lambda xs: finite_flag(xs, way=way))
    assert bool(check(leaves))
    for i, bad, at in _cases(leaves[:-1]):
        name = list(SHAPES)[i]
        assert not bool(check(_poisoned(leaves, i, bad, at))), (name, bad, at)


def test_float64_and_complex128_leaves_are_checked_in_their_own_dtype() -> None:
    # on a CPU device: a TPU computes f64 with f32's exponent range, so f64's
    # largest values are Inf there before any check reads them
    with jax.enable_x64(True), jax.default_device(cpu_devices(1)[0]):
        leaves = [_largest((64, 64), jnp.float64), _largest((64, 64), jnp.complex128)]
        leaves += [_largest((7,), jnp.float64), _largest((7,), jnp.complex128)]
        check = jax.jit(finite_flag)
        assert bool(check(leaves))
        for i, bad, at in _cases(leaves):
            assert not bool(check(_poisoned(leaves, i, bad, at))), (leaves[i].dtype, bad, at)


def test_leaves_sharded_over_explicit_axes_are_checked_as_they_lie() -> None:
    mesh = cpu_mesh((4, 2), ("a", "b"), (AxisType.Explicit,) * 2)
    specs = [P("a", "b"), P(None, "b"), P("a"), P()]
    shapes = [(64, 128), (64, 128), (4096,), (64, 64)]
    leaves = [_largest(s, jnp.float32) for s in shapes]
    check = jax.jit(finite_flag)
    with jax.set_mesh(mesh):
        assert bool(check([jax.device_put(x, p) for x, p in zip(leaves, specs)]))
        for i, bad, at in _cases(leaves):
            poisoned = _poisoned(leaves, i, bad, at)
            placed = [jax.device_put(x, p) for x, p in zip(poisoned, specs)]
            assert not bool(check(placed)), (specs[i], bad, at)


def _adam_step(opt: Any) -> Any:
    @jax.jit
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        def loss(p: Any) -> jax.Array:
            return jnp.mean(jnp.tanh(batch["x"] @ p["w"] + p["b"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        # the poison lands in the new params, written by the update's own fusion
        return {"w": params["w"] + batch["poison"], "b": params["b"]}, opt_state, value

    return step


@pytest.mark.parametrize(
    ("bad", "at"),
    [
        # the default run takes two corners; the slow run every pair
        pytest.param(
            bad,
            at,
            id=f"{bad_id}-{at_id}",
            marks=[] if f"{bad_id}-{at_id}" in ("nan-first", "inf-last") else [pytest.mark.slow],
        )
        for bad, bad_id in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf"))
        for at, at_id in (((0, 0), "first"), ((256, 256), "middle"), ((511, 511), "last"))
    ],
)
def test_a_recorded_adam_step_refuses_one_nan_or_inf_in_a_large_leaf(
    at: tuple[int, int], bad: float
) -> None:
    opt = optax.adam(1e-3)
    # the rows of w's product with zeros are as many as b's values: XLA on the CPU
    # may then fuse that product into the sum of the marks (an output fusion)
    params = {"w": jnp.full((512, 512), 0.01), "b": jnp.zeros(512)}
    state = opt.init(params)
    x = jnp.ones((8, 512))
    with tempfile.TemporaryDirectory() as d:
        train = tg.FlightRecorder(d, batch="digest").wrap(_adam_step(opt))
        params, state, _ = train(params, state, {"x": x, "poison": jnp.zeros((512, 512))})
        poison = jnp.zeros((512, 512)).at[at].set(bad)
        with pytest.raises(tg.NonFiniteError) as info:
            train(params, state, {"x": x, "poison": poison})
    assert (info.value.where, info.value.path) == ("the updated params", "['w']")
    assert info.value.counts == {"['w']": 1}


_DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32, "c64": jnp.complex64}


def test_the_check_finds_one_nan_or_inf_in_any_float_dtype_and_passes_the_largest_values() -> None:
    # every float value at its dtype's largest: a sum of the values would overflow;
    # leaves large enough for a vectorised reduction, which a max would let a NaN slip
    leaves = [np.full((64, 64), jnp.finfo(d).max, d) for d in _DTYPES.values()]
    leaves.append(np.arange(4))
    check = jax.jit(finite_flag)
    assert bool(check(leaves))
    for i, dtype in enumerate(_DTYPES.values()):
        poisons = [np.nan, np.inf, -np.inf]
        if dtype == jnp.complex64:
            poisons += [complex(0.0, np.inf), complex(np.nan, 0.0)]
        for bad in poisons:
            for at in [(0, 0), (32, 0), (63, 63)]:
                poisoned = list(leaves)
                poisoned[i] = leaves[i].copy()
                poisoned[i][at] = bad
                assert not bool(check(poisoned)), (dtype, bad, at)


@pytest.mark.skipif(not hasattr(jnp, "float8_e8m0fnu"), reason="this jax has no float8_e8m0fnu")
@pytest.mark.parametrize("way", ["cpu", "shape", "leaf"])
@pytest.mark.parametrize("shape", [(), (8,), (64, 64)])
def test_a_dtype_without_a_zero_is_finite_when_its_values_are(way: Any, shape: Any) -> None:
    # float8_e8m0fnu holds powers of two and NaN, no zero: its own x - x is NaN
    dtype = jnp.float8_e8m0fnu
    check = jax.jit(lambda xs: finite_flag(xs, way=way))
    leaf = np.full(shape, 2.0, np.float32).astype(dtype)
    assert bool(check([jnp.ones(4), leaf]))
    poisoned = np.full(shape, 2.0, np.float32)
    poisoned.flat[-1] = np.nan
    assert not bool(check([jnp.ones(4), poisoned.astype(dtype)]))
