"""Optimizer state that follows the params: moments kept by key path, new
params initialised, removed ones dropped, every unmappable leaf named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import treeguard as tg
from tests.drawn import drawn
from treeguard.examples import cnn, eqx_mlp


def _stepped(opt: Any, params: Any) -> Any:
    """The state after one eager update, the params as their own grads."""
    return opt.update(params, opt.init(params), params)[1]


OLD = {"body": {"w": jnp.arange(6.0).reshape(2, 3)}, "old": jnp.ones(2)}
NEW = {"body": {"w": jnp.zeros((2, 3))}, "head": jnp.zeros(4)}


def _same(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_adam_moments_follow_their_params() -> None:
    opt = optax.adam(1e-2)
    state = _stepped(opt, OLD)
    new_state, report = tg.migrate_opt_state(opt, state, OLD, NEW)
    _same(new_state[0].mu["body"]["w"], state[0].mu["body"]["w"])
    _same(new_state[0].nu["body"]["w"], state[0].nu["body"]["w"])
    _same(new_state[0].mu["head"], jnp.zeros(4))
    assert int(new_state[0].count) == 1
    assert str(report) == (
        "optimizer state: 4 changes\n"
        "  initialised [0].mu['head'] f32[4]\n"
        "  initialised [0].nu['head'] f32[4]\n"
        "  dropped [0].mu['old'] f32[2]\n"
        "  dropped [0].nu['old'] f32[2]"
    )
    jax.tree.map(lambda a, b: None, new_state, opt.init(NEW))  # the new params' structure


@pytest.mark.parametrize(
    "opt",
    [
        optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
        optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
        optax.masked(optax.adam(1e-2), lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
        optax.multi_transform(
            {"a": optax.adam(1e-2), "s": optax.sgd(1e-2, momentum=0.9)},
            lambda p: jax.tree.map(lambda x: "a" if x.ndim > 1 else "s", p),
        ),
        optax.sgd(1e-2, momentum=0.9),
    ],
    ids=["chain", "inject_hyperparams", "masked", "multi_transform", "momentum"],
)
def test_composite_states_keep_every_leaf_of_a_kept_param(opt: Any) -> None:
    state = _stepped(opt, OLD)
    new_state, report = tg.migrate_opt_state(opt, state, OLD, NEW)
    assert jax.tree.structure(new_state) == jax.tree.structure(opt.init(NEW))
    old_flat = dict(zip((leaf.path for leaf in tg.spec_of(state).leaves), jax.tree.leaves(state)))
    kept = 0
    for leaf, value in zip(tg.spec_of(new_state).leaves, jax.tree.leaves(new_state)):
        if leaf.path in old_flat:
            _same(value, old_flat[leaf.path])
            kept += 1
    assert kept >= 1
    assert all("['head']" in p for p in report.initialised)
    assert all("['old']" in p for p in report.dropped)


def test_a_param_whose_shape_changed_is_refused_unless_reinit() -> None:
    opt = optax.adam(1e-2)
    state = _stepped(opt, OLD)
    new = {"body": {"w": jnp.zeros((3, 3))}, "old": jnp.ones(2)}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.migrate_opt_state(opt, state, OLD, new)
    assert str(info.value) == (
        "optimizer state: 2 mismatches between the old state and the optimizer's state for the "
        "new params:\n"
        "  [0].mu['body']['w']: shape f32[3,3] in the optimizer's state for the new params, "
        "f32[2,3] in the old state\n"
        "  [0].nu['body']['w']: shape f32[3,3] in the optimizer's state for the new params, "
        "f32[2,3] in the old state\n"
        "hint: each state leaf is matched by key path; a moment follows its param, anything "
        "else must keep its path. Pass the optimizer the old state was made with, or "
        'reinit="changed" for a param whose shape changed'
    )
    new_state, report = tg.migrate_opt_state(opt, state, OLD, new, reinit="changed")
    assert report.reinitialised == ("[0].mu['body']['w']", "[0].nu['body']['w']")
    _same(new_state[0].mu["old"], state[0].mu["old"])


def test_a_state_that_does_not_mirror_the_params_is_refused_by_name() -> None:
    state = _stepped(optax.sgd(1e-2, momentum=0.9), OLD)
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.migrate_opt_state(optax.adam(1e-2), state, OLD, NEW)
    paths = {(m.path, m.kind) for m in info.value.mismatches}
    assert ("[0].count", "missing") in paths
    assert ("[0].trace['body']['w']", "unexpected") in paths


def test_an_unknown_reinit_is_refused() -> None:
    with pytest.raises(tg.ConfigError, match="reinit must be None or 'changed', got 'all'"):
        tg.migrate_opt_state(
            optax.adam(1e-2), _stepped(optax.adam(1e-2), OLD), OLD, NEW, reinit="all"
        )  # type: ignore[arg-type]


class CNNWithHead(cnn.CNN):
    def __init__(self, *, rngs: nnx.Rngs) -> None:
        super().__init__(rngs=rngs)
        self.aux = nnx.Linear(cnn.CLASSES, 2, rngs=rngs)


def _loss_of(module_type: type) -> Any:
    graphdef = nnx.graphdef(module_type(rngs=nnx.Rngs(0)))

    def loss(p: Any, b: Any) -> jax.Array:
        logits = nnx.merge(graphdef, p)(b["image"])[..., : cnn.CLASSES]
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["label"]).mean()

    return loss


@pytest.mark.slow
def test_a_cnn_gains_a_head_and_resumes_training_with_its_moments_bit_exact(
    tmp_path: Path,
) -> None:
    batch = {k: jnp.asarray(v[:32]) for k, v in cnn.splits()["train"].items()}
    step = tg.optax_step(optax.adam(1e-2))
    params = cnn.init(jax.random.key(0))
    state = step.init(params)
    grad = jax.jit(jax.grad(cnn.loss))
    for _ in range(3):
        params, state = step(params, grad(params, batch), state)
    tg.save(tmp_path / "params.safetensors", params)
    tg.save(tmp_path / "opt.safetensors", state)
    new_init = nnx.split(CNNWithHead(rngs=nnx.Rngs(params=jax.random.key(1))), nnx.Param)[1]
    new_params = tg.load(
        tmp_path / "params.safetensors", like=new_init, missing="init", init=new_init
    )
    old_state = tg.load(tmp_path / "opt.safetensors", like=state)
    new_state, report = step.migrate_opt_state(old_state, params, new_params)
    assert report.initialised == (
        "[0].mu['aux']['bias'].value",
        "[0].mu['aux']['kernel'].value",
        "[0].nu['aux']['bias'].value",
        "[0].nu['aux']['kernel'].value",
    )
    for path in ("['linear2']['kernel'].value", "['conv1']['bias'].value"):
        for moment in ("mu", "nu"):
            old = tg.spec_of(state).leaves
            where = [leaf.path for leaf in old].index(f"[0].{moment}{path}")
            new_leaves = tg.spec_of(new_state).leaves
            there = [leaf.path for leaf in new_leaves].index(f"[0].{moment}{path}")
            assert (
                np.asarray(jax.tree.leaves(new_state)[there]).tobytes()
                == np.asarray(jax.tree.leaves(state)[where]).tobytes()
            )
    assert int(new_state[0].count) == 3
    new_grad = jax.jit(jax.grad(_loss_of(CNNWithHead)))
    for _ in range(2):
        new_params, new_state = step(new_params, new_grad(new_params, batch), new_state)
    assert int(new_state[0].count) == 5
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(new_params))


def test_an_equinox_mlp_loses_a_layer_and_its_moments_are_dropped() -> None:
    old = eqx_mlp.init(jax.random.key(0))
    new = eqx.filter(eqx.nn.MLP(2, 1, 8, 1, key=jax.random.key(5)), eqx.is_array)
    new = eqx.tree_at(
        lambda m: (m.layers[0].weight, m.layers[0].bias),
        new,
        (old.layers[0].weight, old.layers[0].bias),
    )
    opt = optax.adam(1e-2)
    state = _stepped(opt, old)
    step = tg.optax_step(opt)
    with pytest.raises(tg.TreeMismatchError, match=r"\[0\]\.mu\.layers\[1\]\.weight: shape"):
        step.migrate_opt_state(state, old, new)
    new_state, report = step.migrate_opt_state(state, old, new, reinit="changed")
    assert report.dropped == (
        "[0].mu.layers[2].bias",
        "[0].mu.layers[2].weight",
        "[0].nu.layers[2].bias",
        "[0].nu.layers[2].weight",
    )
    _same(new_state[0].mu.layers[0].weight, state[0].mu.layers[0].weight)


def test_moments_follow_a_renamed_layer_of_the_equinox_mlp(tmp_path: Path) -> None:
    old = eqx_mlp.init(jax.random.key(0))
    opt = optax.adam(1e-2)
    state = _stepped(opt, old)
    path = tmp_path / "mlp.safetensors"
    tg.save(path, old)
    like = eqx.filter(eqx.nn.MLP(2, 1, 8, 1, key=jax.random.key(5)), eqx.is_array)
    rename = {".layers[2]": ".layers[1]"}
    new = tg.load(path, like=like, rename=rename, unexpected=[".layers[1]"])
    new_state, report = tg.migrate_opt_state(opt, state, old, new, rename=rename)
    _same(new_state[0].mu.layers[1].weight, state[0].mu.layers[2].weight)
    _same(new_state[0].nu.layers[1].bias, state[0].nu.layers[2].bias)
    assert "renamed [0].mu.layers[1].weight f32[1,8] (from [0].mu.layers[2].weight)" in str(report)
    assert report.dropped == (
        "[0].mu.layers[1].bias",
        "[0].mu.layers[1].weight",
        "[0].nu.layers[1].bias",
        "[0].nu.layers[1].weight",
    )


def test_an_nnx_optimizer_state_follows_a_head_added_to_the_cnn() -> None:
    model = drawn(lambda: cnn.CNN(rngs=nnx.Rngs(0)), 0)  # the form, no initializer compiled
    old_opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    old_params = nnx.state(model, nnx.Param)
    grads = jax.tree.map(jnp.ones_like, old_params)
    old_opt.update(model, grads)
    bigger = drawn(lambda: CNNWithHead(rngs=nnx.Rngs(1)), 1)
    new_opt = nnx.Optimizer(bigger, optax.adam(1e-2), wrt=nnx.Param)
    state, report = tg.migrate_opt_state(
        new_opt, nnx.state(old_opt), old_params, nnx.state(bigger, nnx.Param)
    )
    assert report.initialised == (
        "['opt_state'][0]['mu']['aux']['bias'].value",
        "['opt_state'][0]['mu']['aux']['kernel'].value",
        "['opt_state'][0]['nu']['aux']['bias'].value",
        "['opt_state'][0]['nu']['aux']['kernel'].value",
    )
    nnx.update(new_opt, state)
    old_mu = nnx.state(old_opt)["opt_state"][0]["mu"]["linear1"]["kernel"][...]
    _same(nnx.state(new_opt)["opt_state"][0]["mu"]["linear1"]["kernel"][...], old_mu)
    assert int(nnx.state(new_opt)["step"][...]) == 1


def test_an_optimizer_of_another_kind_is_refused() -> None:
    with pytest.raises(tg.ConfigError, match="an optax GradientTransformation or an nnx"):
        tg.migrate_opt_state(object(), {}, OLD, NEW)


# -- a newcomer's nnx model (BatchNorm, Dropout): every form of optimizer and state ----


def _nnx_trained_optimizer() -> tuple[Any, Any]:
    from nnxmodels import Net

    model = Net(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    opt.update(model, jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param)))
    return model, opt


_HEAD = (
    "['opt_state'][0]['mu']['head']['bias'].value",
    "['opt_state'][0]['mu']['head']['kernel'].value",
    "['opt_state'][0]['nu']['head']['bias'].value",
    "['opt_state'][0]['nu']['head']['kernel'].value",
)


def _to_the_head(given: str, part: str | None) -> tuple[Any, Any, Any, Any, Any]:
    """The trained nnx optimizer's state (or its ``part``) migrated to the
    model with a head by ``given``: ``(state, report, old_opt, new_opt, bigger)``."""
    from nnxmodels import NetWithHead

    model, old_opt = _nnx_trained_optimizer()
    bigger = NetWithHead(nnx.Rngs(1))
    new_opt = nnx.Optimizer(bigger, optax.adam(1e-2), wrt=nnx.Param)
    optimizer = optax.adam(1e-2) if given == "optax transform" else new_opt
    old = nnx.state(old_opt) if part is None else nnx.state(old_opt)[part]
    state, report = tg.migrate_opt_state(
        optimizer, old, nnx.state(model, nnx.Param), nnx.state(bigger, nnx.Param)
    )
    return state, report, old_opt, new_opt, bigger


@pytest.mark.parametrize("given", ["optax transform", "nnx.Optimizer"])
def test_an_nnx_optimizer_state_migrates_with_either_optimizer(given: str) -> None:
    state, report, old_opt, new_opt, bigger = _to_the_head(given, None)
    assert report.initialised == _HEAD
    nnx.update(new_opt, state)  # the nnx form, whichever optimizer built it
    got = nnx.state(new_opt)
    _same(
        got["opt_state"][0]["mu"]["norm"]["scale"][...],
        old_opt.opt_state[0].mu["norm"]["scale"][...],
    )
    assert int(got["step"][...]) == 1
    # and it trains on: one more step of the new optimizer
    new_opt.update(bigger, jax.tree.map(jnp.ones_like, nnx.state(bigger, nnx.Param)))
    assert int(nnx.state(new_opt)["step"][...]) == 2


@pytest.mark.parametrize("given", ["optax transform", "nnx.Optimizer"])
def test_the_opt_state_part_of_an_nnx_optimizer_migrates_in_its_form(given: str) -> None:
    part, report, _, new_opt, _ = _to_the_head(given, "opt_state")
    assert report.initialised == tuple(p[len("['opt_state']") :] for p in _HEAD)
    assert jax.tree.structure(part) == jax.tree.structure(nnx.state(new_opt)["opt_state"])


def test_an_optax_state_migrates_with_an_nnx_optimizer() -> None:
    from nnxmodels import Net, NetWithHead

    tx = optax.adam(1e-2)
    old = nnx.state(Net(nnx.Rngs(0)), nnx.Param)
    bigger = NetWithHead(nnx.Rngs(1))
    new_params = nnx.state(bigger, nnx.Param)
    new_opt = nnx.Optimizer(bigger, tx, wrt=nnx.Param)
    state, report = tg.migrate_opt_state(new_opt, _stepped(tx, old), old, new_params)
    assert report.initialised == (
        "[0].mu['head']['bias'].value",
        "[0].mu['head']['kernel'].value",
        "[0].nu['head']['bias'].value",
        "[0].nu['head']['kernel'].value",
    )
    assert jax.tree.structure(state) == jax.tree.structure(tx.init(new_params))  # optax form


def test_params_of_another_filter_than_the_optimizers_are_refused_by_form() -> None:
    from nnxmodels import NetWithHead

    model, old_opt = _nnx_trained_optimizer()
    bigger = NetWithHead(nnx.Rngs(1))
    with pytest.raises(tg.TreeMismatchError) as info:  # BatchNorm's stats are no nnx.Param
        tg.migrate_opt_state(
            optax.adam(1e-2),
            nnx.state(old_opt),
            nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat)),
            nnx.state(bigger, nnx.Any(nnx.Param, nnx.BatchStat)),
        )
    lines = str(info.value).splitlines()
    assert lines[:2] == [
        "optimizer state: 4 mismatches between the old state and the optimizer's state for the "
        "new params:",
        "  ['opt_state'][0]['mu']['norm']['mean'].value: missing: f32[8] in the optimizer's "
        "state for the new params, absent in the old state",
    ]
    assert lines[-1] == (
        "hint: old_state is an nnx.Optimizer's state (nnx.state(optimizer)); the new one was "
        "built in that form from this optax transform. Pass old_params and new_params as the "
        "optimizer's wrt filter gives them (nnx.state(model, nnx.Param)), and the transform the "
        "old state was made with. Each state leaf is matched by key path; a moment follows its "
        'param, anything else keeps its path; reinit="changed" gives a param whose shape '
        "changed a fresh state"
    )
