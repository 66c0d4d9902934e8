"""Checked updates: apply_updates, updater, optax_step, find_nonfinite."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from corpus import CORPUS, seed_params
from jax.sharding import NamedSharding, PartitionSpec
from machine import cpu_mesh
from subproc import run_python

from treeguard import (
    Cast,
    InvalidTreeError,
    NonFiniteError,
    TracedValueError,
    TreeMismatchError,
    apply_updates,
    count_nonfinite,
    find_nonfinite,
    optax_step,
    updater,
)


def seed_grads() -> dict[str, Any]:
    return jax.tree.map(jnp.ones_like, seed_params())


def sgd_step(**kw: Any) -> Any:
    return updater(lambda p, g, *, lr: p - lr * g, **kw)


def assert_trees_equal(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.shape(x) == np.shape(y)
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# -- the seed's update ---------------------------------------------------------


def test_seed_update_decreases_every_element_by_lr() -> None:
    params = seed_params()
    new = sgd_step()(params, seed_grads(), lr=0.01)
    for p, q in zip(jax.tree.leaves(params), jax.tree.leaves(new)):
        np.testing.assert_allclose(np.asarray(q), np.asarray(p) - 0.01, rtol=1e-6)
        assert q.shape == p.shape and q.dtype == p.dtype


def test_apply_updates_matches_optax_on_matching_trees() -> None:
    params = seed_params()
    updates = jax.tree.map(lambda g: -0.01 * g, seed_grads())
    assert_trees_equal(apply_updates(params, updates), optax.apply_updates(params, updates))


@pytest.mark.parametrize("name,factory", CORPUS, ids=[n for n, _ in CORPUS])
def test_zero_update_keeps_every_corpus_tree(name: str, factory: Any) -> None:
    tree = factory()
    zeros = jax.tree.map(lambda x: np.zeros_like(np.asarray(x)), tree)
    new = apply_updates(tree, zeros)
    assert jax.tree.structure(new) == jax.tree.structure(tree)
    for x, y in zip(jax.tree.leaves(tree), jax.tree.leaves(new)):
        assert np.asarray(x).dtype == y.dtype and np.shape(x) == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_eager_jit_and_vmap_agree(variant: Any) -> None:
    step = sgd_step(on_nonfinite="skip")
    params, grads = seed_params(), seed_grads()
    expected = sgd_step()(params, grads, lr=0.01)
    got = variant(lambda p, g: step(p, g, lr=0.01))(params, grads)
    for x, y in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
        assert x.dtype == y.dtype


# -- every drift is refused, by path ---------------------------------------------


def test_broadcast_shape_is_refused_with_path() -> None:
    grads = seed_grads()
    grads["dense1"]["b"] = jnp.ones((2, 3))
    with pytest.raises(TreeMismatchError) as e:
        sgd_step()(seed_params(), grads, lr=0.01)
    assert "['dense1']['b']: shape (3,) in the params, (2, 3) in the updates" in str(e.value)
    assert [m.path for m in e.value.mismatches] == ["['dense1']['b']"]


def test_every_offending_path_is_listed() -> None:
    grads = seed_grads()
    grads["dense1"]["b"] = jnp.ones((2, 3))
    grads["dense2"]["w"] = jnp.ones((1, 3))
    with pytest.raises(TreeMismatchError) as e:
        apply_updates(seed_params(), grads)
    assert {m.path for m in e.value.mismatches} == {"['dense1']['b']", "['dense2']['w']"}


def test_prefix_structure_grads_are_refused() -> None:
    params = seed_params()
    # jax.tree.map(f, params, grads) accepts this: params is a prefix of grads
    grads = jax.tree.map(lambda g: {"a": g, "b": g}, seed_grads())
    with pytest.raises(TreeMismatchError) as e:
        apply_updates(params, grads)
    assert "['dense1']['w']" in str(e.value)
    assert e.value.mismatches[0].kind == "node_type"


def test_renamed_key_is_refused_with_a_rename_hint() -> None:
    grads = seed_grads()
    grads["dense_2"] = grads.pop("dense2")
    with pytest.raises(TreeMismatchError) as e:
        apply_updates(seed_params(), grads)
    text = str(e.value)
    assert "['dense2']: missing" in text and "['dense_2']: unexpected" in text
    assert "did you mean `['dense2']`?" in text


def test_bf16_params_with_f32_grads_are_refused_with_both_dtypes() -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    with pytest.raises(TreeMismatchError) as e:
        sgd_step(names=("grads",))(params, seed_grads(), lr=0.01)
    text = str(e.value)
    assert "['dense1']['w']: dtype bfloat16 in the params, float32 in the grads" in text
    assert 'dtype_policy="cast"' in text
    assert len(e.value.mismatches) == 4


def test_strongly_typed_lr_promotion_is_refused() -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_grads())
    with pytest.raises(TreeMismatchError) as e:
        sgd_step()(params, grads, lr=jnp.asarray(0.01, jnp.float32))
    text = str(e.value)
    assert "dtype bfloat16 in the params, float32 in fn's result" in text
    assert "Python float" in text


def test_python_float_lr_keeps_every_dtype() -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_grads())
    new = sgd_step()(params, grads, lr=0.01)
    assert {x.dtype for x in jax.tree.leaves(new)} == {jnp.dtype(jnp.bfloat16)}


def test_x64_mode_does_not_turn_f32_into_f64() -> None:
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), seed_params())
        grads = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), seed_grads())
        new = sgd_step()(params, grads, lr=0.01)
        assert {x.dtype for x in jax.tree.leaves(new)} == {jnp.dtype(jnp.float32)}
        with pytest.raises(TreeMismatchError, match="float32 in the params, float64 in fn's"):
            sgd_step()(params, grads, lr=np.float64(0.01))  # strong f64
        f64_grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float64), grads)
        with pytest.raises(TreeMismatchError, match="float32 in the params, float64 in the upd"):
            apply_updates(params, f64_grads)


def test_integer_params_with_float_updates_are_refused_under_any_policy() -> None:
    params = {"step": jnp.asarray(3, jnp.int32), "w": jnp.ones(2)}
    updates = {"step": jnp.asarray(1.0), "w": jnp.ones(2)}
    for policy in ("strict", "cast"):
        with pytest.raises(TreeMismatchError) as e:
            apply_updates(params, updates, dtype_policy=policy)
        assert "['step']: dtype int32 in the params, float32 in the updates" in str(e.value)
        assert "integer or bool params cannot take a float" in str(e.value)


def test_cast_policy_casts_on_purpose_and_reports_it() -> None:
    params = {"w": jnp.ones(3, jnp.bfloat16), "b": jnp.zeros(3)}
    updates = {"w": jnp.full(3, -0.5), "b": jnp.ones(3)}
    new, casts = apply_updates(params, updates, dtype_policy="cast", report=True)
    assert new["w"].dtype == jnp.bfloat16 and new["b"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(new["w"], np.float32), [0.5, 0.5, 0.5])
    assert casts == (Cast("['w']", "float32", "bfloat16", "the updates"),)
    step = updater(lambda p, g: p - 0.1 * g, dtype_policy="cast")
    step(params, updates)
    assert step.casts == (Cast("['w']", "float32", "bfloat16", "the updates"),)


def test_fn_that_broadcasts_is_refused() -> None:
    step = updater(lambda p, g: p - g[..., None])
    with pytest.raises(TreeMismatchError, match=r"\['w'\]: shape \(3,\) in the params"):
        step({"w": jnp.ones(3)}, {"w": jnp.ones(3)})


def test_non_scalar_hyperparameter_is_refused() -> None:
    with pytest.raises(TreeMismatchError, match=r"lr=: shape \(\) in a scalar"):
        sgd_step()(seed_params(), seed_grads(), lr=jnp.ones(3))
    with pytest.raises(InvalidTreeError, match="lr=: keyword argument of type str"):
        sgd_step()(seed_params(), seed_grads(), lr="0.01")


# -- bad input -----------------------------------------------------------------


def test_non_array_leaf_is_refused_with_path() -> None:
    grads = seed_grads()
    grads["dense1"]["b"] = "zeros"
    with pytest.raises(InvalidTreeError) as e:
        apply_updates(seed_params(), grads)
    assert "['dense1']['b']: leaf of type str is not an array (in the updates)" in str(e.value)


def test_leaked_tracer_is_refused_with_path() -> None:
    leaked: list[Any] = []

    @jax.jit
    def leak(x: Any) -> Any:
        leaked.append(x)
        return x

    leak(jnp.ones(3))
    with pytest.raises(InvalidTreeError) as e:
        apply_updates({"w": jnp.ones(3)}, {"w": leaked[0]})
    assert "['w']: f32[3] is a tracer that leaked" in str(e.value)
    assert isinstance(e.value.__cause__, jax.errors.UnexpectedTracerError)


def test_cyclic_tree_is_refused() -> None:
    grads: dict[str, Any] = {"w": jnp.ones(1)}
    grads["again"] = grads
    with pytest.raises(InvalidTreeError, match="contains itself"):
        apply_updates({"w": jnp.ones(1)}, grads)


def test_donated_params_cannot_be_reused() -> None:
    step = sgd_step(donate=True)
    params = seed_params()
    new = step(params, seed_grads(), lr=0.01)
    assert all(x.is_deleted() for x in jax.tree.leaves(params))
    np.testing.assert_allclose(np.asarray(new["dense1"]["w"]), 0.99, rtol=1e-6)
    with pytest.raises(InvalidTreeError, match=r"\['dense1'\]\['b'\]: f32\[3\] was deleted"):
        step(params, seed_grads(), lr=0.01)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="dtype_policy must be one of"):
        updater(lambda p, g: p, dtype_policy="loose")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        updater(lambda p, g: p, on_nonfinite="warn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer must have init and update"):
        optax_step(object())


# -- compile once per signature ----------------------------------------------------


def test_compile_count_stays_at_one_over_many_steps() -> None:
    step = sgd_step()
    params, grads = seed_params(), seed_grads()
    for i in range(50):
        params = step(params, grads, lr=0.01 * (1 + i % 3))
    assert step.compile_count == 1
    expected = -sum(0.01 * (1 + i % 3) for i in range(50))
    np.testing.assert_allclose(np.asarray(params["dense2"]["b"]), expected, rtol=1e-4)


def test_compile_count_rises_once_per_new_signature() -> None:
    step = sgd_step()
    small = {"w": jnp.ones(3)}
    big = {"w": jnp.ones(5)}
    for _ in range(3):
        step(small, small, lr=0.1)
    assert step.compile_count == 1
    for _ in range(3):
        step(big, big, lr=0.1)
    assert step.compile_count == 2
    step(small, small, lr=0.1)
    assert step.compile_count == 2
    with pytest.raises(TreeMismatchError):
        step(small, big, lr=0.1)
    assert step.compile_count == 2


# -- non-finite values -----------------------------------------------------------


def nan_grads() -> dict[str, Any]:
    grads = seed_grads()
    grads["dense2"]["w"] = jnp.array([[1.0], [jnp.nan], [jnp.inf]])
    return grads


def test_skip_keeps_params_bit_identical_and_counts(variant: Any) -> None:
    step = sgd_step(on_nonfinite="skip")
    params = jax.tree.map(lambda x: x + 0.123, seed_params())
    same = variant(lambda p, g: step(p, g, lr=0.01))(params, nan_grads())
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(same)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_skip_counts_skipped_steps() -> None:
    step = sgd_step(on_nonfinite="skip", donate=True)
    params = seed_params()
    before = jax.tree.map(np.asarray, params)
    for _ in range(3):
        params = step(params, nan_grads(), lr=0.01)
    params = step(params, seed_grads(), lr=0.01)
    assert step.skipped == 3
    np.testing.assert_allclose(np.asarray(params["dense1"]["w"]), before["dense1"]["w"] - 0.01)


def test_raise_names_each_nonfinite_leaf_and_keeps_params() -> None:
    step = sgd_step()
    params = seed_params()
    with pytest.raises(NonFiniteError) as e:
        step(params, nan_grads(), lr=0.01)
    text = str(e.value)
    assert "1 leaf holds NaN or Inf in the updated params:" in text
    assert "['dense2']['w']: 2 of 3 values (f32[3,1])" in text
    assert e.value.counts == {"['dense2']['w']": 2}
    assert e.value.params is params


def test_raise_with_donation_returns_the_old_params_in_the_error() -> None:
    step = sgd_step(donate=True)
    params = jax.tree.map(lambda x: x + 1, seed_params())
    before = jax.tree.map(np.asarray, params)
    with pytest.raises(NonFiniteError) as e:
        step(params, nan_grads(), lr=0.01)
    assert e.value.counts == {"['dense2']['w']": 2}  # found in the updates
    assert_trees_equal(e.value.params, before)


def test_raise_inside_jit_is_refused_clearly() -> None:
    step = sgd_step()
    with pytest.raises(TracedValueError, match='pass on_nonfinite="skip"'):
        jax.jit(lambda p, g: step(p, g, lr=0.01))(seed_params(), seed_grads())


def test_ignore_lets_nonfinite_through() -> None:
    new = sgd_step(on_nonfinite="ignore")(seed_params(), nan_grads(), lr=0.01)
    assert np.isnan(np.asarray(new["dense2"]["w"])).sum() == 1


def test_find_nonfinite_names_paths_and_counts() -> None:
    grads = nan_grads()
    grads["dense1"]["b"] = jnp.array([1.0, -jnp.inf, 0.0], jnp.bfloat16)
    grads["step"] = jnp.asarray(3)
    assert find_nonfinite(grads) == {"['dense1']['b']": 1, "['dense2']['w']": 2}
    assert find_nonfinite(seed_grads()) == {}
    assert find_nonfinite({}) == {}
    with pytest.raises(TracedValueError, match="count_nonfinite"):
        jax.jit(find_nonfinite)(grads)


def test_find_nonfinite_counts_host_values_at_their_own_dtype() -> None:
    # without x64 JAX would make f64 1e300 an f32 Inf: host values never go through it
    tree = {
        "a": np.array([1e300, np.nan], np.float64),
        "b": jnp.array([jnp.inf, 0.0]),
        "c": np.float64(1e40),
        "d": [float("inf"), 2.0],
        "e": np.arange(3),
    }
    assert find_nonfinite(tree) == {"['a']": 1, "['b']": 1, "['d'][0]": 1}
    assert find_nonfinite({"c": np.float64(1e40), "f": np.full(3, 1e300)}) == {}


def test_count_nonfinite_is_traceable() -> None:
    counts = jax.jit(count_nonfinite)(nan_grads())
    assert int(counts["dense2"]["w"]) == 2 and int(counts["dense1"]["w"]) == 0
    total = jax.jit(lambda t: sum(jax.tree.leaves(count_nonfinite(t))))(nan_grads())
    assert int(total) == 2


# -- optax -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [lambda: optax.adam(1e-2), lambda: optax.sgd(1e-2)], ids=["adam", "sgd"]
)
def test_optax_step_matches_optax_and_compiles_once(make: Any) -> None:
    opt = make()
    step = optax_step(opt)
    params, grads = seed_params(), seed_grads()
    state = step.init(params)
    ref_params, ref_state = params, opt.init(params)
    for _ in range(5):
        params, state = step(params, grads, state)
        updates, ref_state = opt.update(grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    assert step.compile_count == 1
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


@pytest.mark.parametrize(
    "make",
    [lambda: optax.adam(1e-2, mu_dtype=jnp.float32), lambda: optax.sgd(1e-2, momentum=0.9)],
    ids=["adam", "sgd"],
)
def test_optax_step_mixed_precision(make: Any) -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_grads())
    step = optax_step(make(), dtype_policy="cast", on_nonfinite="skip")
    state = step.init(params)
    dtypes = [x.dtype for x in jax.tree.leaves(state)]
    for _ in range(3):
        params, state = step(params, grads, state)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert [x.dtype for x in jax.tree.leaves(state)] == dtypes
    assert step.compile_count == 1


def test_optax_step_strict_refuses_f32_updates_for_bf16_params() -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_grads())
    step = optax_step(optax.adam(1e-2, mu_dtype=jnp.float32))
    with pytest.raises(TreeMismatchError) as e:
        step(params, grads, step.init(params))
    text = str(e.value)
    assert "dtype bfloat16 in the params, float32 in the updates from optimizer.update" in text
    assert 'dtype_policy="cast"' in text


def test_optax_step_refuses_a_moment_drifting_to_f32() -> None:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), seed_params())
    step = optax_step(optax.adam(1e-2), dtype_policy="cast")
    with pytest.raises(TreeMismatchError) as e:
        step(params, seed_grads(), step.init(params))
    text = str(e.value)
    assert (
        "[0].mu['dense1']['w']: dtype bfloat16 in the state passed in, float32 in the "
        "state optimizer.update returned" in text
    )
    assert "mu_dtype" in text


def test_optax_step_refuses_grads_and_state_that_do_not_fit() -> None:
    step = optax_step(optax.adam(1e-2))
    params = seed_params()
    grads = seed_grads()
    grads["dense1"]["b"] = jnp.ones((2, 3))
    with pytest.raises(TreeMismatchError, match=r"\['dense1'\]\['b'\]: shape \(3,\) in the par"):
        step(params, grads, step.init(params))
    other = step.init({"w": jnp.ones(2)})
    with pytest.raises(TreeMismatchError, match="in the state optimizer.init makes"):
        step(params, seed_grads(), other)


def test_optax_step_skip_keeps_params_and_state() -> None:
    step = optax_step(optax.adam(1e-2), on_nonfinite="skip", donate=True)
    params = seed_params()
    state = step.init(params)
    params, state = step(params, seed_grads(), state)
    before = jax.tree.map(np.asarray, (params, state))
    params, state = step(params, nan_grads(), state)
    assert step.skipped == 1
    assert_trees_equal((params, state), before)


def test_optax_step_raise_names_the_leaf() -> None:
    step = optax_step(optax.sgd(1e-2))
    params = seed_params()
    state = step.init(params)
    with pytest.raises(NonFiniteError) as e:
        step(params, nan_grads(), state)
    assert e.value.counts == {"['dense2']['w']": 2}
    assert e.value.params is params and e.value.state is state


def _sgd(p: Any, g: Any, *, lr: float) -> Any:  # module-level: pickled by name
    return p - lr * g


def test_an_updater_pickles_and_deep_copies_as_it_did_before_its_caches_had_a_lock() -> None:
    """A step's per-sharding programs are kept in a map with a lock: a copy
    (pickled to a worker, or ``copy.deepcopy`` of an object holding the
    step) gets its own map and lock, and the copy steps as the original."""
    fresh = updater(_sgd)
    params, grads = seed_params(), seed_grads()
    for copied in (pickle.loads(pickle.dumps(fresh)), copy.deepcopy(fresh)):
        assert_trees_equal(copied(params, grads, lr=0.1), fresh(params, grads, lr=0.1))


def test_an_updater_used_on_several_devices_still_pickles() -> None:
    """Its programs are kept per sharding, keyed by devices, which do not
    pickle: a copy starts without them and compiles its own."""
    sharding = NamedSharding(cpu_mesh((8,), ("x",)), PartitionSpec("x"))
    params = {"w": jax.device_put(jnp.ones((8, 4)), sharding)}
    grads = {"w": jax.device_put(jnp.full((8, 4), 2.0), sharding)}
    step = updater(_sgd)
    want = step(params, grads, lr=0.5)
    for copied in (pickle.loads(pickle.dumps(step)), copy.deepcopy(step)):
        got = copied(params, grads, lr=0.5)
        assert_trees_equal(got, want)
        assert got["w"].sharding.is_equivalent_to(sharding, 2)
        assert copied.compile_count == step.compile_count + 1  # its own program


#: The child, on one device: an updater used once, then pickled and deep-copied.
_ONE_DEVICE_COPY = """
import copy, pickle
import jax, jax.numpy as jnp
from treeguard import updater
def sgd(p, g, *, lr):
    return p - lr * g
step = updater(sgd)
params, grads = {"w": jnp.ones((4, 2))}, {"w": jnp.full((4, 2), 2.0)}
want = step(params, grads, lr=0.5)
for copied in (pickle.loads(pickle.dumps(step)), copy.deepcopy(step)):
    got = copied(params, grads, lr=0.5)
    print(jax.device_count(), bool((got["w"] == want["w"]).all()), step.compile_count,
          copied.compile_count)
"""


def test_an_updater_used_on_one_device_pickles_and_its_copy_counts_its_own_programs() -> None:
    """As on several devices: a copy starts without the program the step
    compiled (a closure that counts into the step that made it, which does
    not pickle) and compiles its own, counted as its own."""
    done = run_python(_ONE_DEVICE_COPY, env={"XLA_FLAGS": ""}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["1 True 1 2", "1 True 1 2"]
