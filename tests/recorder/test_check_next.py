"""``check="next"``: the flag stays on the device and sticks at the first
non-finite step, whose params and state every later step then returns
unchanged; the host reads it every 16 steps (the documented window) or at
``flush``, and refuses the step that went wrong with its own bundle."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from machine import cpu_mesh

import treeguard as tg

from . import nanmodels as nm

GOOD = {"x": jnp.array([1.0, 4.0, 9.0])}
BAD = {"x": jnp.array([1.0, -4.0, 9.0])}
#: The documented window: a non-finite step raises from a call at most this
#: many steps after it.
WINDOW = 17


#: The two marks a step's program hands on: its loss, carrying the flag, where
#: the loss is a floating scalar; the watch (two int32) otherwise.
MARKS = pytest.mark.parametrize("mark", ["carried", "watch"])
SGD = optax.sgd(0.1)


@jax.jit
def _sgd_step(params: Any, state: Any, batch: Any) -> Any:
    """The optax step's update as a step function, its loss a vector of one
    value (not a scalar, so it cannot carry the flag: the watch does)."""
    loss, grads = jax.value_and_grad(nm.tiny_loss)(params, batch)
    updates, state = SGD.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss.reshape(1)


def _train_next(directory: Path, mark: str = "carried") -> tg.RecordedStep:
    recorder = tg.FlightRecorder(directory, batch="record")
    if mark == "watch":
        return recorder.wrap(_sgd_step, check="next")
    return recorder.wrap(tg.optax_step(SGD), loss=nm.tiny_loss, check="next")


def _init(train: tg.RecordedStep, params: Any) -> Any:
    try:
        return train.init(params)
    except tg.ConfigError:  # a step function: no optimizer of its own
        return SGD.init(params)


def _until_refused(train: tg.RecordedStep, params: Any, state: Any) -> tuple[int, Any]:
    """Good steps until one raises: how many calls it took, and the error;
    every step after the bad one returns the params it was given."""
    for calls in range(1, 3 * WINDOW):
        try:
            new_params, state, _ = train(params, state, GOOD)
        except tg.NonFiniteError as e:
            return calls, e
        np.testing.assert_array_equal(np.asarray(new_params["w"]), np.asarray(params["w"]))
        params = new_params
    raise AssertionError("the non-finite step was never refused")


def _trained(train: tg.RecordedStep, steps: int) -> tuple[Any, Any]:
    """The params and state after ``steps`` finite steps from ones."""
    params = {"w": jnp.ones(3)}
    state = _init(train, params)
    for _ in range(steps):
        params, state, _ = train(params, state, GOOD)
    return params, state


@MARKS
def test_a_nonfinite_step_is_held_on_the_device_and_refused_within_the_window(
    tmp_path: Path, mark: str
) -> None:
    train = _train_next(tmp_path / "nan", mark)
    params, state = _trained(train, 5)
    before = np.asarray(params["w"])
    held, state, loss = train(params, state, BAD)  # returned: its flag is not read yet
    assert not np.isfinite(loss) and train.step_number == 6
    np.testing.assert_array_equal(np.asarray(held["w"]), before)  # the step held, not applied
    calls, e = _until_refused(train, held, state)
    assert calls <= WINDOW
    assert str(e).splitlines()[0] == "step 5: 1 leaf holds NaN or Inf in the loss:"
    assert e.bundle == str(tmp_path / "nan" / "000001-step5")
    assert "check='next'" in str(e).splitlines()[-1]
    np.testing.assert_array_equal(np.asarray(e.params["w"]), before)  # from before step 5
    assert train.step_number == 5  # neither step 5 nor the ones after it are taken
    bundle = tg.read_bundle(e.bundle)
    assert bundle.step == 5
    np.testing.assert_array_equal(np.asarray(bundle.load_batch()["x"]), np.asarray(BAD["x"]))
    np.testing.assert_array_equal(np.asarray(bundle.load_state("params", params)["w"]), before)
    train.flush()  # nothing is pending after the error


@MARKS
def test_the_steps_after_an_error_are_numbered_from_it_and_watched_afresh(
    tmp_path: Path, mark: str
) -> None:
    train = _train_next(tmp_path / "nan", mark)
    params, state = _trained(train, 0)
    params, state, _ = train(params, state, BAD)
    with pytest.raises(tg.NonFiniteError, match="^step 0: "):
        train.flush()
    for _ in range(3):  # resumed from the error's params: finite steps are applied again
        params, state, loss = train(params, state, GOOD)
    assert np.isfinite(loss) and train.step_number == 3
    train(params, state, BAD)
    with pytest.raises(tg.NonFiniteError, match="^step 3: "):
        train.flush()


def test_check_next_flushes_the_last_step_and_matches_check_now(tmp_path: Path) -> None:
    now = tg.FlightRecorder(tmp_path / "a", batch="record").wrap(
        tg.optax_step(optax.sgd(0.1)), loss=nm.tiny_loss
    )
    lagged = _train_next(tmp_path / "b")
    sides = []
    for train in (now, lagged):
        params = {"w": jnp.ones(3)}
        state = train.init(params)
        for _ in range(2 * WINDOW):
            params, state, _ = train(params, state, GOOD)
        train.flush()
        sides.append(params)
    np.testing.assert_array_equal(np.asarray(sides[0]["w"]), np.asarray(sides[1]["w"]))
    params, state, _ = lagged(sides[1], lagged.init(sides[1]), BAD)
    with pytest.raises(tg.NonFiniteError, match=f"^step {2 * WINDOW}: 1 leaf holds NaN"):
        lagged.flush()
    lagged.flush()  # once
    with pytest.raises(tg.ConfigError, match="check must be 'now' or 'next', got 'later'"):
        tg.FlightRecorder(tmp_path, batch="record").wrap(nm.tiny_loss, check="later")  # type: ignore[arg-type]


class _Out(NamedTuple):
    params: Any
    state: Any
    loss: Any


def _poisoned(dtype: Any = jnp.float32) -> Any:
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        new = {"w": (params["w"] * jnp.where(batch < 0, jnp.inf, 1.0) + batch).astype(dtype)}
        return _Out(new, state, jnp.sum(batch))

    return step


def test_a_jitted_step_function_is_held_and_replayed_naming_its_params(tmp_path: Path) -> None:
    train = tg.FlightRecorder(tmp_path, batch="digest").wrap(_poisoned(), check="next")
    params = {"w": jnp.ones(3)}
    out = train(params, None, jnp.ones(3))
    assert isinstance(out, _Out)  # its own type, as with check="now"
    held = train(out.params, None, jnp.array([-1.0, 0.0, 1.0]))
    assert float(held.loss) == 0.0  # the step's own loss: it is finite
    np.testing.assert_array_equal(np.asarray(held.params["w"]), np.asarray(out.params["w"]))
    with pytest.raises(tg.NonFiniteError) as info:
        train.flush()
    assert (
        str(info.value).splitlines()[0] == "step 1: 1 leaf holds NaN or Inf in the updated params:"
    )
    assert info.value.path == "['w']"


def test_check_next_refuses_a_step_it_cannot_hold(tmp_path: Path) -> None:
    recorder = tg.FlightRecorder(tmp_path, batch="digest")

    def eager(params: Any, state: Any, batch: Any) -> Any:
        return params, state, jnp.sum(batch)

    with pytest.raises(tg.ConfigError) as info:
        recorder.wrap(eager, check="next")
    assert str(info.value) == (
        'check="next" compiles the flag into the step\'s program, and the step is not jitted\n'
        'hint: record jax.jit(step), or use check="now"'
    )
    train = recorder.wrap(_poisoned(jnp.bfloat16), check="next")
    with pytest.raises(tg.ConfigError) as info:
        train({"w": jnp.ones(3)}, None, jnp.ones(3))
    lines = str(info.value).splitlines()
    assert lines[0] == "the step returned the params['w'] as bfloat16[3], given float32[3]"
    assert lines[1].startswith('hint: check="next" returns the params and the state from before')
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


@MARKS
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_check_next_holds_and_refuses_params_sharded_over_a_mesh(
    tmp_path: Path, axis_type: Any, mark: str
) -> None:
    mesh = cpu_mesh((2, 4), ("x", "y"), (axis_type,) * 2)
    sharding = NamedSharding(mesh, P("x", "y"))
    train = _train_next(tmp_path, mark)
    good = {"x": jax.device_put(jnp.ones((8, 8)), sharding)}
    params = {"w": jax.device_put(jnp.ones((8, 8)), sharding)}
    state = _init(train, params)
    with jax.set_mesh(mesh):
        for _ in range(WINDOW):  # a read of the watch, placed beside the params
            params, state, _ = train(params, state, good)
        before = np.asarray(params["w"])
        held, state, _ = train(params, state, {"x": -good["x"]})
        assert held["w"].sharding == sharding
        np.testing.assert_array_equal(np.asarray(held["w"]), before)
        with pytest.raises(tg.NonFiniteError, match=f"^step {WINDOW}: 1 leaf holds NaN"):
            train.flush()


def test_check_next_keeps_no_params_alive_once_flushed(tmp_path: Path) -> None:
    train = _train_next(tmp_path)
    params = {"w": jnp.ones(3)}
    state = train.init(params)
    for _ in range(3):
        params, state, _ = train(params, state, GOOD)
    train.flush()
    newest = weakref.ref(params["w"])
    del params, state
    gc.collect()
    assert newest() is None  # the caller's last params are the caller's alone


@MARKS
def test_check_next_refuses_a_step_numbered_past_int32(tmp_path: Path, mark: str) -> None:
    recorder = tg.FlightRecorder(tmp_path, batch="record")
    step = _sgd_step if mark == "watch" else tg.optax_step(SGD)
    loss = None if mark == "watch" else nm.tiny_loss
    train = recorder.wrap(step, loss=loss, start=2**31 - 2, check="next")
    params = {"w": jnp.ones(3)}
    state = _init(train, params)
    for _ in range(3):  # the third is numbered 2**31: the watch counts from its own start
        params, state, _ = train(params, state, GOOD)
    before = np.asarray(params["w"])
    held, state, _ = train(params, state, BAD)
    np.testing.assert_array_equal(np.asarray(held["w"]), before)
    with pytest.raises(tg.NonFiniteError, match=f"^step {2**31 + 1}: 1 leaf holds NaN"):
        train.flush()
    assert train.step_number == 2**31 + 1


def test_a_batch_changed_in_place_before_its_flag_is_read_is_named(tmp_path: Path) -> None:
    train = _train_next(tmp_path)
    params = {"w": jnp.ones(3)}
    state = train.init(params)
    buffer = np.array([1.0, -4.0, 9.0], np.float32)  # a loader's reused host buffer
    train(params, state, {"x": buffer})
    buffer[:] = [1.0, 4.0, 9.0]  # the next batch written over it before the flag is read
    with pytest.raises(tg.NonFiniteError) as info:
        train.flush()
    first = str(info.value).splitlines()[0]
    assert first.startswith("step 0: its flag was set on the device, but replaying it from")
    assert "the batch was changed in place after the call" in first


def test_the_step_number_is_read_only(tmp_path: Path) -> None:
    train = _train_next(tmp_path)
    with pytest.raises(AttributeError):
        train.step_number = 100  # type: ignore[misc]


@MARKS
@pytest.mark.parametrize("placed", ["one device", "mesh"])
def test_placed_params_compile_the_recorded_program_once(
    tmp_path: Path, mark: str, placed: str
) -> None:
    # the first step's mark lies where the program puts the marks it returns:
    # an uncommitted one beside committed params compiled the program twice
    if placed == "mesh":
        target: Any = NamedSharding(cpu_mesh((8,), ("d",), (AxisType.Auto,)), P())
    else:
        target = jax.devices("cpu")[1]
    train = _train_next(tmp_path, mark)
    params = {"w": jax.device_put(jnp.ones(3), target)}
    state = _init(train, params)
    params, state, _ = train(params, state, GOOD)  # compiles
    compiles: list[str] = []

    def listen(event: str, duration: float, **_: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for _ in range(3):
            params, state, _ = train(params, state, GOOD)
        train.flush()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []


def test_a_loss_that_stops_carrying_the_mark_mid_run_is_refused(tmp_path: Path) -> None:
    # a float loss first, an integer one later: the NaN mark would become an int and
    # stop sticking, and a later non-finite step would go unread
    train = tg.FlightRecorder(tmp_path, batch="digest").wrap(
        jax.jit(lambda p, s, b: ({"w": p["w"] * b.sum()}, s, jnp.sum(b, axis=0))), check="next"
    )
    params, _, _ = train({"w": jnp.ones(3)}, None, jnp.ones(3))
    with pytest.raises(tg.ConfigError) as info:
        train(params, None, jnp.ones(3, jnp.int32))
    assert str(info.value).splitlines() == [
        "the step returned its loss as int32[], and the run's first step as a float32 scalar: "
        'with check="next" that loss carries the flag from one step to the next',
        'hint: keep the loss one strongly typed scalar dtype for the whole run, or use check="now"',
    ]
    with pytest.raises(tg.ConfigError, match=r"its loss as float32\[1\], and"):
        train(params, None, jnp.ones((3, 1)))  # a vector loss would be read as the watch
    train.flush()  # the finite steps before it are read


def test_a_deleted_returned_loss_is_named_not_a_deleted_buffer(tmp_path: Path) -> None:
    train = _train_next(tmp_path)
    params = {"w": jnp.ones(3)}
    state = _init(train, params)
    params, state, loss = train(params, state, GOOD)
    loss.delete()  # as a jitted update that donates it would
    for attempt in (lambda: train(params, state, GOOD), train.flush):
        with pytest.raises(tg.ConfigError) as info:
            attempt()
        assert str(info.value).startswith("the loss a step returned was deleted or donated")
        assert "donate jnp.copy(loss) instead" in str(info.value)


@pytest.mark.skipif(not hasattr(jnp, "float8_e8m0fnu"), reason="this jax has no float8_e8m0fnu")
def test_a_loss_of_a_dtype_without_zero_carries_the_mark(tmp_path: Path) -> None:
    # float8_e8m0fnu holds NaN but no zero: a first mark of zero would be NaN
    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        return {"w": params["w"] + batch}, state, jnp.sum(batch).astype(jnp.float8_e8m0fnu)

    train = tg.FlightRecorder(tmp_path, batch="digest").wrap(step, check="next")
    params: Any = {"w": jnp.ones(3)}
    for _ in range(3):
        params, _, _ = train(params, None, jnp.ones(3))
    train.flush()
    assert np.asarray(params["w"]).tolist() == [4.0, 4.0, 4.0]
    params, _, _ = train(params, None, jnp.array([1.0, jnp.inf, 1.0]))
    with pytest.raises(tg.NonFiniteError, match="^step 3: "):
        train.flush()


def test_host_params_are_moved_to_the_device_once_at_the_first_step(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # the first mark is made beside the params' device arrays only: host ones
    # would be moved for it and again for the step
    train = _train_next(tmp_path, "watch")
    params = {"w": np.ones(3, np.float32)}  # as loaded from a file
    state = _init(train, params)
    capfd.readouterr()
    with jax.transfer_guard_host_to_device("log"):
        train(params, state, GOOD)
    logged = capfd.readouterr().err.splitlines()
    moved = [
        line for line in logged if "host-to-device transfer: aval=ShapedArray(float32[3])" in line
    ]
    assert len(moved) == 1, logged  # the params, once (the batch is on the device already)
    train.flush()


def test_an_older_returned_loss_deleted_before_its_read_is_named(tmp_path: Path) -> None:
    # the step that went wrong is found among the losses of the steps not read
    # yet: one of them deleted is named, not read as a deleted buffer
    train = _train_next(tmp_path)
    params = {"w": jnp.ones(3)}
    state = _init(train, params)
    losses = []
    for _ in range(4):
        params, state, loss = train(params, state, GOOD)
        losses.append(loss)
    losses[1].delete()
    train(params, state, BAD)
    with pytest.raises(tg.ConfigError, match="^the loss a step returned was deleted or donated"):
        train.flush()
