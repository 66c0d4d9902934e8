"""verify checks the data it is given against the batch spec, names the
``Model`` argument that accepts another refusal, and trains with an optimizer
state (optax's ``init``/``update``, or ``update(params, grads, opt_state)``)
whose contract is checked at every step."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from onecheck import check, context, example_hashes

from treeguard import ConfigError
from treeguard.examples import mlp

BASE = mlp.model


_ctx = context


def _splits(**changes: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    return {**mlp.splits(), **changes}


# -- the data ------------------------------------------------------------------


def test_a_float64_case_is_refused_by_name_path_and_both_dtypes() -> None:
    x = np.zeros((4, 2))  # float64, which jnp.asarray would quietly make float32
    m = dataclasses.replace(BASE, cases={"mine": {"x": x, "y": np.zeros((4, 1), np.float32)}})
    ctx = _ctx(m)
    assert [c.name for c in ctx.positive] == ["standard", "single", "zeros", "boundary"]
    result = check("contract", ctx)
    assert result.status == "fail"
    assert result.evidence[:2] == [
        "case 'mine': ['x']: dtype float32 in the batch spec, float64 in the case",
        "1 case(s) do not match Model.batch_spec and ran in no other check; hint: build each "
        "case's leaves with the spec's shapes and dtypes, e.g. np.asarray(x, np.float32)",
    ]


def test_a_wrong_width_split_is_named() -> None:
    rng = np.random.default_rng(0)
    val = {"x": rng.random((16, 3), np.float32), "y": rng.random((16, 1), np.float32)}
    result = check("splits", _ctx(dataclasses.replace(BASE, splits=_splits(val=val))))
    assert result.status == "fail"
    assert result.summary == "1 split(s) do not match the batch spec"
    assert result.evidence == [
        "split 'val': ['x']: shape ('B', 2) in the batch spec, (16, 3) in the split",
        "split 'val' does not match Model.batch_spec, so its examples were not compared; hint: "
        "give it the spec's dtypes and feature shapes, examples along axis 0",
    ]


def test_unequal_row_counts_name_the_split_and_both_sizes() -> None:
    val = {"x": np.zeros((15, 2), np.float32), "y": np.zeros((16, 1), np.float32)}
    result = check("splits", _ctx(dataclasses.replace(BASE, splits=_splits(val=val))))
    assert result.evidence[0] == (
        "split 'val': ['y']: dim B=15 (bound at ['x']) in the batch spec, B=16 in the split"
    )


def test_example_hashes_names_each_leaf_count() -> None:
    with pytest.raises(ValueError) as info:
        example_hashes({"x": np.zeros((15, 2)), "y": np.zeros((16, 1))}, where="split 'val'")
    assert str(info.value) == (
        "split 'val': leaves disagree on the number of examples: ['x'] has 15, ['y'] has 16; "
        "hint: give every leaf the same number of rows along axis 0"
    )


# -- the refusal ---------------------------------------------------------------


def _apply_without_a_check(params: Any, batch: Any) -> Any:
    return batch["x"] @ params["dense1"]["w"]  # a (8, 3) x (2, 3) matmul: TypeError


def test_a_type_error_points_to_invalid_raises() -> None:
    result = check("negative", _ctx(dataclasses.replace(BASE, apply=_apply_without_a_check)))
    assert result.status == "fail"
    (line,) = result.evidence
    assert line.startswith(
        "invalid case 'invalid_shape' (['x'] is f32[8,3] where the contract says f32[B,2]): "
        "raised TypeError (dot_general requires contracting dimensions to have the same shape"
    )
    assert line.endswith(
        "instead of ValueError; hint: if TypeError is the refusal you mean, declare it: "
        "Model(invalid_raises=(ValueError, TypeError))"
    )
    ok = dataclasses.replace(
        BASE, apply=_apply_without_a_check, invalid_raises=(ValueError, TypeError)
    )
    assert check("negative", _ctx(ok)).status == "pass"


# -- training with an optimizer state --------------------------------------------


def test_adam_trains_and_keeps_the_state_contract() -> None:
    m = dataclasses.replace(BASE, update=None, optimizer=optax.adam(0.05))
    result = check("training", _ctx(m))
    assert result.status == "pass", result.evidence
    assert result.summary.endswith("params and optimizer state keep their specs")
    assert result.evidence[1] == "optimizer state: 9 leaves, 27 values"


def _drifting_update(params: Any, grads: Any, state: Any) -> Any:
    new = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    return new, {"count": state["count"] + 1, "m": state["m"].astype(jnp.bfloat16)}


def test_a_drifting_optimizer_state_is_named_by_path() -> None:
    m = dataclasses.replace(
        BASE,
        update=_drifting_update,
        opt_init=lambda p: {"count": jnp.zeros((), jnp.int32), "m": jnp.zeros(3)},
    )
    result = check("training", _ctx(m))
    assert result.status == "fail"
    assert result.evidence[0] == (
        "step 1 optimizer state: ['m']: dtype float32 in the initial state, bfloat16 in the "
        "updated state"
    )


class _HalfPrecisionUpdates:
    """An optimizer whose updates are bfloat16: added to f32 params, they would promote."""

    def init(self, params: Any) -> Any:
        return ()

    def update(self, grads: Any, state: Any, params: Any = None) -> Any:
        return jax.tree.map(lambda g: (-0.01 * g).astype(jnp.bfloat16), grads), state


def test_updates_of_another_dtype_are_named_before_they_are_added() -> None:
    m = dataclasses.replace(BASE, update=None, optimizer=_HalfPrecisionUpdates())
    result = check("training", _ctx(m))
    assert result.status == "fail"
    assert result.evidence[0] == (
        "step 1 updates: ['dense1']['b']: dtype float32 in the params, bfloat16 in the "
        "optimizer's updates"
    )


def test_model_refuses_a_half_described_optimizer() -> None:
    with pytest.raises(ConfigError, match=r"without init and update; hint: pass an optax"):
        dataclasses.replace(BASE, update=None, optimizer=object())
    with pytest.raises(ConfigError, match=r"both optimizer= and update="):
        dataclasses.replace(BASE, optimizer=optax.sgd(0.1))
    with pytest.raises(ConfigError, match=r"Model.opt_init needs a function and update"):
        dataclasses.replace(BASE, update=None, opt_init=lambda p: ())
