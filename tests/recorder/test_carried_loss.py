"""A recorded step with ``check="now"`` reads one scalar a step: its loss,
NaN unless every checked leaf is finite. What the caller gets back is the
loss itself, and a step whose loss is finite but whose params are not is
still refused, reporting the real loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import treeguard as tg


def _step(dtype: Any = jnp.float32, poison: float = 1.0) -> Any:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        new = {"w": params["w"] * poison + batch}
        loss = jnp.sum(batch).astype(dtype)
        return new, state, loss

    return step


def _wrap(tmp_path: Path, step: Any, **options: Any) -> tg.RecordedStep:
    return tg.FlightRecorder(tmp_path, batch="record").wrap(step, **options)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_the_returned_loss_is_the_steps_own_value_and_dtype(tmp_path: Path, dtype: Any) -> None:
    step = _step(dtype)
    params, batch = {"w": jnp.ones(3)}, jnp.array([0.5, 1.25, 2.0])
    _, _, bare = step(params, None, batch)
    _, _, got = _wrap(tmp_path, step)(params, None, batch)
    assert got.dtype == bare.dtype and got.shape == ()
    assert np.asarray(got).tobytes() == np.asarray(bare).tobytes()


def test_a_weakly_typed_loss_stays_weakly_typed(tmp_path: Path) -> None:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        return params, state, jnp.asarray(2.0)  # a Python float: weakly typed

    _, _, bare = step({"w": jnp.ones(2)}, None, jnp.ones(2))
    _, _, got = _wrap(tmp_path, step)({"w": jnp.ones(2)}, None, jnp.ones(2))
    assert bare.weak_type and got.weak_type and float(got) == 2.0


def test_finite_loss_with_nonfinite_params_is_refused_naming_the_params(tmp_path: Path) -> None:
    train = _wrap(tmp_path, _step(poison=jnp.inf))
    with pytest.raises(tg.NonFiniteError) as info:
        train({"w": jnp.ones(3)}, None, jnp.array([-1.0, 0.0, 1.0]))
    message = str(info.value)
    assert "in the updated params" in message
    assert "in the loss" not in message  # the real loss (0.0) is what the report looks at
    assert info.value.path == "['w']"


def test_a_nonfinite_loss_is_refused_naming_the_loss(tmp_path: Path) -> None:
    train = _wrap(tmp_path, _step())
    with pytest.raises(tg.NonFiniteError) as info:
        train({"w": jnp.ones(3)}, None, jnp.array([jnp.nan, 0.0, 1.0]))
    assert "in the loss" in str(info.value)


class _Out(NamedTuple):
    params: Any
    state: Any
    loss: Any


@pytest.mark.parametrize(
    "make_loss",
    [
        lambda b: jnp.sum(b).astype(jnp.int32),  # not a float: the flag is read
        lambda b: b * 2.0,  # not a scalar
    ],
    ids=["int-loss", "vector-loss"],
)
def test_steps_without_a_float_scalar_loss_are_checked_by_their_flag(
    tmp_path: Path, make_loss: Any
) -> None:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        return {"w": params["w"] / batch[0]}, state, make_loss(batch)

    train = _wrap(tmp_path, step)
    _, _, loss = train({"w": jnp.ones(3)}, None, jnp.array([2.0, 1.0, 1.0]))
    assert np.array_equal(np.asarray(loss), np.asarray(make_loss(jnp.array([2.0, 1.0, 1.0]))))
    with pytest.raises(tg.NonFiniteError, match="in the updated params"):
        train({"w": jnp.ones(3)}, None, jnp.array([0.0, 1.0, 1.0]))


def test_a_named_tuple_step_comes_back_as_its_own_type(tmp_path: Path) -> None:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        return _Out({"w": params["w"] + batch}, state, jnp.sum(batch))

    train = _wrap(tmp_path, step)
    out = train({"w": jnp.ones(2)}, None, jnp.ones(2))
    assert isinstance(out, _Out) and float(out.loss) == 2.0
    with pytest.raises(tg.NonFiniteError):
        train({"w": jnp.ones(2)}, None, jnp.array([1.0, jnp.inf]))


def test_check_next_returns_nan_as_the_loss_from_the_step_it_refuses_later(
    tmp_path: Path,
) -> None:
    # the loss carries the mark: the step's own loss while every step is finite,
    # NaN from the first step that is not (its params held), until the read refuses it
    _, _, loss = _wrap(tmp_path, _step(), check="next")(
        {"w": jnp.ones(3)}, None, jnp.array([0.5, 0.25, 1.0])
    )
    assert float(loss) == 1.75
    train = _wrap(tmp_path, _step(poison=jnp.inf), check="next")
    held, _, loss = train({"w": jnp.ones(3)}, None, jnp.array([-1.0, 0.0, 1.0]))
    assert np.isnan(float(loss))  # the step's own loss is 0.0: the NaN is the mark
    assert np.asarray(held["w"]).tolist() == [1.0, 1.0, 1.0]  # from before the step
    with pytest.raises(tg.NonFiniteError, match="in the updated params") as info:
        train.flush()
    assert "in the loss" not in str(info.value)  # the report replays the real loss (0.0)


def test_check_next_with_a_weakly_typed_loss_keeps_its_type(tmp_path: Path) -> None:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        return {"w": params["w"] + batch}, state, jnp.asarray(2.0)  # weakly typed

    train = _wrap(tmp_path, step, check="next")
    params: Any = {"w": jnp.ones(2)}
    for _ in range(3):
        params, _, loss = train(params, None, jnp.ones(2))
        assert loss.weak_type and float(loss) == 2.0
    train.flush()
    params, _, loss = train(params, None, jnp.array([1.0, jnp.inf]))
    with pytest.raises(tg.NonFiniteError, match="step 3: .* in the updated params"):
        train.flush()


@pytest.mark.skipif(not hasattr(jnp, "float4_e2m1fn"), reason="this jax has no float4")
def test_a_loss_of_a_dtype_without_nan_does_not_carry_the_flag(tmp_path: Path) -> None:
    # float4 turns NaN into a finite value: the flag is read instead
    train = _wrap(tmp_path, _step(jnp.float4_e2m1fn, poison=jnp.inf))
    with pytest.raises(tg.NonFiniteError, match="in the updated params"):
        train({"w": jnp.ones(3)}, None, jnp.array([-1.0, 0.0, 1.0]))


def test_a_nonfinite_loss_its_replay_does_not_repeat_is_still_named(tmp_path: Path) -> None:
    # the program returns the carried loss in the loss's place; a refused step's real
    # loss comes from a replay, and a loss that does not repeat (atomics, another
    # fusion near overflow; here a host callback that is NaN once) is still named
    calls = []

    def once() -> np.ndarray[Any, Any]:
        calls.append(1)
        return np.float32(np.nan if len(calls) == 1 else 0.0)

    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        extra = jax.pure_callback(once, jax.ShapeDtypeStruct((), jnp.float32))
        return {"w": params["w"] + batch}, state, jnp.sum(batch) + extra

    with pytest.raises(tg.NonFiniteError) as info:
        _wrap(tmp_path, step)({"w": jnp.ones(3)}, None, jnp.ones(3))
    assert str(info.value).splitlines()[0] == "step 0: 1 leaf holds NaN or Inf in the loss:"
    assert len(calls) == 2  # the step and its replay


def test_an_optax_steps_grads_are_replayed_for_its_report(tmp_path: Path) -> None:
    # with check="now" an OptaxStep's program leaves the grads out; the report has them
    train = tg.FlightRecorder(tmp_path, batch="record").wrap(
        tg.optax_step(optax.sgd(0.1)), loss=lambda p, b: jnp.sum(jnp.sqrt(b) * p["w"])
    )
    params = {"w": jnp.ones(3)}
    with pytest.raises(tg.NonFiniteError) as info:
        train(params, train.init(params), jnp.array([1.0, -1.0, 4.0]))
    message = str(info.value)
    assert "in the grads" in message and "in the loss" in message
