"""``check="next"`` on every bundled example model: the seed's MLP (a dict of
params, the example's own SGD, no optimizer state), the flax.nnx CNN (an
``nnx.State`` of Params, adam) and the equinox MLP (the ``eqx.filter``
partition, adam), each recorded as a jitted step function and as an
``optax_step``. Finite steps give the params a bare loop of the same step
gives, bit for bit; a NaN fed in the inputs of step ``K`` is refused on a
later call (or at ``flush``) naming step ``K``, with the bare loop's params
from before it, and a bundle that reads back as step ``K``; training resumed
from the error's params goes on as the bare loop does. The same over Auto and
Explicit meshes. Public API only: the flag's carrier is the recorder's own
business. The default run trains the seed's MLP on one device (under a second
a test); the CNN's compiles take seconds and the equinox MLP's about one, so
their cases, the flush and the meshes are in the slow run (the default run
keeps under its time budget; `test_check_next` covers flush and meshes
there)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
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
from tests.drawn import cnn_params
from treeguard.examples import cnn, eqx_mlp, mlp

#: The documented window: a non-finite step raises from a call at most this
#: many steps after it, or from ``flush``.
WINDOW = 17
#: The step whose batch holds a NaN: not a multiple of 16 (the flag is read
#: every 16 steps), so its refusal comes on a later call.
K = 5
#: Steps in a run: past ``K + WINDOW``, so the refusal comes from a call.
STEPS = K + WINDOW + 2
#: Rows a batch: the examples' 64 training rows make 8 batches, cycled.
BATCH = 8


Batch = dict[str, Any]


class Example(NamedTuple):
    """A bundled model as its tests train it."""

    init: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Any  # optax's; None: the example's own update, no optimizer state
    data: Callable[[], Batch]
    poison: Callable[[Batch], Batch]  # a host batch with a NaN in its inputs


def _nan_at(name: str, index: tuple[int, ...]) -> Callable[[Batch], Batch]:
    """The host batch with a NaN at ``batch[name][index]``."""

    def poison(batch: Batch) -> Batch:
        leaf = np.array(batch[name])
        leaf[index] = np.nan
        return {**batch, name: leaf}

    return poison


EXAMPLES = {
    "mlp": Example(
        lambda: mlp.init(jax.random.key(0)),
        mlp.loss,
        None,
        lambda: mlp.splits()["train"],
        _nan_at("x", (3, 1)),
    ),
    # the CNN's values drawn by numpy: its initializers compile for seconds
    "nnx-cnn": Example(
        lambda: cnn_params(0),
        cnn.loss,
        optax.adam(1e-2),
        lambda: cnn.splits()["train"],
        _nan_at("image", (2, 4, 4, 0)),
    ),
    "eqx-mlp": Example(
        lambda: eqx_mlp.init(jax.random.key(0)),
        eqx_mlp.loss,
        optax.adam(1e-2),
        lambda: eqx_mlp.splits()["train"],
        _nan_at("x", (3, 1)),
    ),
}


def _jitted(ex: Example) -> Callable[..., Any]:
    """The example's training step, jitted: ``(params, state, batch) -> (params, state, loss)``."""

    @jax.jit
    def step(params: Any, state: Any, batch: Any) -> Any:
        value, grads = jax.value_and_grad(ex.loss)(params, batch)
        if ex.optimizer is None:  # the seed's own SGD
            return mlp.update(params, grads), state, value
        updates, state = ex.optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return step


def _optimizer(ex: Example) -> Any:
    return optax.sgd(mlp.LEARNING_RATE) if ex.optimizer is None else ex.optimizer


class Run(NamedTuple):
    """A recorded training setup and its bare loop's history."""

    batches: list[Batch]  # on the device, one a step
    bad: Batch  # step K's batch with a NaN in its inputs
    start: tuple[Any, Any]  # params and optimizer state before step 0
    history: list[tuple[Any, Any, Any]]  # the bare loop's (params, state, loss) after each step
    wrap: Callable[[tg.FlightRecorder], tg.RecordedStep]


def _bare(step: Callable[..., Any], params: Any, state: Any, batches: list[Any]) -> list[Any]:
    history = []
    for batch in batches:
        params, state, value = step(params, state, batch)
        history.append((params, state, value))
    return history


def _batches(ex: Example, put: Callable[[Any], Any]) -> tuple[list[Batch], Batch]:
    """``STEPS`` batches of ``BATCH`` rows, cycling through the example's
    data, and step ``K``'s poisoned, each ``put`` on the device."""
    data = ex.data()
    n = len(next(iter(data.values())))
    cut = [{k: v[i : i + BATCH] for k, v in data.items()} for i in range(0, n, BATCH)]
    host = [cut[i % len(cut)] for i in range(STEPS)]
    return [put(b) for b in host], put(ex.poison(host[K]))


@functools.cache
def _mesh(axis_type: Any) -> jax.sharding.Mesh:
    """Eight CPU devices on one ``data`` axis of ``axis_type``."""
    return cpu_mesh((8,), ("data",), (axis_type,))


def _placed(axis_type: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """How batches and params are put: uncommitted on one device (``None``),
    or the batch split over ``_mesh(axis_type)`` and the params replicated."""
    if axis_type is None:
        return (lambda b: jax.tree.map(jnp.asarray, b)), (lambda t: t)
    mesh = _mesh(axis_type)
    rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    return (lambda b: jax.device_put(b, rows)), (lambda t: jax.device_put(t, whole))


@functools.cache
def _run(name: str, kind: str, axis_type: Any = None) -> Run:
    """The example ``name`` recorded as ``kind`` (``"jit"``: its jitted step;
    ``"optax_step"``: ``tg.optax_step`` with its loss), placed as ``_placed``
    says, with the bare loop of the same step run once for the module's tests."""
    ex = EXAMPLES[name]
    put_batch, put_tree = _placed(axis_type)
    batches, bad = _batches(ex, put_batch)
    params = put_tree(ex.init())
    opt = _optimizer(ex)
    step = _jitted(ex if kind == "jit" else ex._replace(optimizer=opt))
    state = None if kind == "jit" and ex.optimizer is None else put_tree(opt.init(params))

    def wrap(rec: tg.FlightRecorder) -> tg.RecordedStep:
        if kind == "jit":
            return rec.wrap(step, check="next")
        return rec.wrap(tg.optax_step(opt), loss=ex.loss, check="next")

    with jax.set_mesh(_mesh(axis_type)) if axis_type is not None else contextlib.nullcontext():
        history = _bare(step, params, state, batches)
    return Run(batches, bad, (params, state), history, wrap)


def _cases(kinds: tuple[str, ...], fast: tuple[str, ...] = ("mlp",)) -> list[Any]:
    """Each example recorded as each of ``kinds``, the cases whose example or
    id is not in ``fast`` in the slow run (the CNN's compiles take seconds)."""
    return [
        pytest.param(
            (name, kind),
            id=f"{name}-{kind}",
            marks=[] if {name, f"{name}-{kind}"} & set(fast) else [pytest.mark.slow],
        )
        for name in EXAMPLES
        for kind in kinds
    ]


BOTH = _cases(("jit", "optax_step"))


def _bitwise(got: Any, want: Any) -> None:
    """The same tree, each leaf of the same dtype, shape and bytes."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(x), np.asarray(y)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("case", BOTH)
def test_finite_steps_give_the_bare_loops_params_bit_for_bit(
    case: tuple[str, str], tmp_path: Path
) -> None:
    run = _run(*case)
    train = run.wrap(tg.FlightRecorder(tmp_path / "nan", batch="record"))
    params, state = run.start
    for i, batch in enumerate(run.batches):
        params, state, value = train(params, state, batch)
        _bitwise(value, run.history[i][2])
    train.flush()
    assert train.step_number == STEPS
    _bitwise(params, run.history[-1][0])
    _bitwise(state, run.history[-1][1])
    assert not (tmp_path / "nan").exists()  # no bundle for a finite run


def _until_refused(
    train: tg.RecordedStep, run: Run, steps: int
) -> tuple[int | None, tg.NonFiniteError]:
    """``steps`` steps, the batch of step ``K`` poisoned, then ``flush``: the
    call that raised (None: ``flush``) and its error. Every step from ``K``
    on returns the params and the state from before ``K``."""
    params, state = run.start
    for i in range(steps):
        batch = run.bad if i == K else run.batches[i]
        try:
            params, state, _ = train(params, state, batch)
        except tg.NonFiniteError as e:
            return i, e
        held = run.history[min(i, K - 1)]  # the bare loop's, held from K on
        _bitwise(params, held[0])
        _bitwise(state, held[1])
    with pytest.raises(tg.NonFiniteError) as info:
        train.flush()
    return None, info.value


def _refused_at_k(e: tg.NonFiniteError, run: Run, train: tg.RecordedStep) -> None:
    """``e`` refuses step ``K``, with the bare loop's params and state from
    before it, and its bundle reads back as step ``K``."""
    assert str(e).startswith(f"step {K}: ")
    # the replay of step K found a leaf that holds NaN: the loss, or (the
    # jitted CNN's loss can stay finite on the CPU) the grads or the params
    assert e.where is not None and e.path is not None
    before_params, before_state, _ = run.history[K - 1]
    _bitwise(e.params, before_params)
    _bitwise(e.state, before_state)
    assert train.step_number == K  # neither step K nor any after it taken
    assert e.bundle is not None and e.bundle_error is None
    bundle = tg.read_bundle(e.bundle)
    assert bundle.step == K
    _bitwise(bundle.load_state("params", before_params), before_params)
    if jax.tree.leaves(before_state):
        _bitwise(bundle.load_state("opt_state", before_state), before_state)
    _bitwise(bundle.load_batch(), run.bad)
    train.flush()  # nothing pending once refused


def _resumes(train: tg.RecordedStep, run: Run, e: tg.NonFiniteError) -> None:
    """Training resumed from the error's params and state, past the bad
    batch, is numbered from ``K`` and gives the bare loop's params again."""
    params, state = e.params, e.state
    for i in range(K, K + 3):
        params, state, _ = train(params, state, run.batches[i])
    train.flush()
    assert train.step_number == K + 3
    _bitwise(params, run.history[K + 2][0])
    _bitwise(state, run.history[K + 2][1])


@pytest.mark.parametrize("case", BOTH)
def test_a_nan_at_step_k_is_refused_on_a_later_call(case: tuple[str, str], tmp_path: Path) -> None:
    run = _run(*case)
    train = run.wrap(tg.FlightRecorder(tmp_path / "nan", batch="record"))
    raised, e = _until_refused(train, run, STEPS)
    assert raised is not None and K < raised <= K + WINDOW
    _refused_at_k(e, run, train)
    _resumes(train, run, e)


@pytest.mark.parametrize("case", _cases(("jit",), fast=()))
def test_a_nan_in_the_last_steps_is_refused_at_flush(case: tuple[str, str], tmp_path: Path) -> None:
    run = _run(*case)
    train = run.wrap(tg.FlightRecorder(tmp_path / "nan", batch="record"))
    raised, e = _until_refused(train, run, K + 3)  # no read of the flag falls after K
    assert raised is None
    _refused_at_k(e, run, train)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("case", _cases(("jit", "optax_step"), fast=()))
def test_a_model_over_a_mesh_is_held_and_refused_as_on_one_device(
    case: tuple[str, str], axis_type: Any, tmp_path: Path
) -> None:
    """The batch split over 8 devices, the params replicated: the bare
    loop's params bit for bit, the held params keep their sharding, step
    ``K`` is refused and training resumes past it."""
    run = _run(*case, axis_type)
    with jax.set_mesh(_mesh(axis_type)):
        train = run.wrap(tg.FlightRecorder(tmp_path / "nan", batch="record"))
        raised, e = _until_refused(train, run, STEPS)
        assert raised is not None and K < raised <= K + WINDOW
        shardings = [x.sharding for x in jax.tree.leaves(e.params)]
        assert shardings == [x.sharding for x in jax.tree.leaves(run.history[K - 1][0])]
        _refused_at_k(e, run, train)
        _resumes(train, run, e)
