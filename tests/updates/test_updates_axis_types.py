"""Checked maps, updates and NaN searches on meshes of every axis type
(Explicit, Auto, and mixed), under ``jax.set_mesh`` and inside ``shard_map``,
on 8 CPU devices in process, with optax and the bundled models."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from machine import cpu_mesh

import treeguard as tg
from treeguard.examples import cnn, eqx_mlp

KINDS = {
    "explicit": (AxisType.Explicit, AxisType.Explicit),
    "auto": (AxisType.Auto, AxisType.Auto),
    "mixed": (AxisType.Explicit, AxisType.Auto),
}

SPECS = {"w": P("x", "y"), "b": P("y"), "scale": P()}


@pytest.fixture(
    params=[pytest.param(k, marks=pytest.mark.slow) if k == "mixed" else k for k in KINDS]
)
def mesh(request: pytest.FixtureRequest) -> jax.sharding.Mesh:
    """A 2x4 mesh of each kind of axes (the mixed one in the slow run)."""
    return cpu_mesh((2, 4), ("x", "y"), KINDS[request.param])


def _put(tree: Any, mesh: jax.sharding.Mesh, specs: Any = SPECS) -> Any:
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)


def _params(mesh: jax.sharding.Mesh) -> dict[str, Any]:
    host = {
        "w": np.arange(64, dtype=np.float32).reshape(8, 8),
        "b": np.arange(8, dtype=np.float32),
        "scale": np.float32(2.0),
    }
    return _put(host, mesh)


def _grads(mesh: jax.sharding.Mesh, specs: Any = SPECS) -> dict[str, Any]:
    host = {"w": np.ones((8, 8), np.float32), "b": np.ones(8, np.float32), "scale": np.float32(1)}
    return _put(host, mesh, specs)


def _same_shardings(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.sharding.is_equivalent_to(y.sharding, x.ndim), (x.sharding, y.sharding)


def _mesh_context(mesh: jax.sharding.Mesh) -> Any:
    """``jax.set_mesh`` where JAX has it, else ``jax.sharding.use_mesh``."""
    set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.set_mesh
    return set_mesh(mesh)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


CONTEXTS: dict[str, Callable[[jax.sharding.Mesh], Any]] = {
    "no-context": lambda mesh: _nothing(),
    "set_mesh": _mesh_context,
}


# -- the contract ----------------------------------------------------------


def test_a_spec_records_the_axis_types(mesh: jax.sharding.Mesh) -> None:
    spec = tg.spec_of(_params(mesh), sharding=True)
    text = {leaf.path: leaf.sharding for leaf in spec.leaves}
    mesh_text = {
        (AxisType.Explicit, AxisType.Explicit): "mesh[x=2:Explicit,y=4:Explicit]",
        (AxisType.Auto, AxisType.Auto): "mesh[x=2,y=4]",
        (AxisType.Explicit, AxisType.Auto): "mesh[x=2:Explicit,y=4:Auto]",
    }[tuple(mesh.axis_types)]
    assert text["['w']"] == f"named({mesh_text}, spec('x', 'y'))"
    assert text["['scale']"] == f"named({mesh_text}, spec())"
    again = tg.TreeSpec.from_json(spec.to_json())
    tg.check(_params(mesh), again)
    # a step's result keeps the contract: JAX writes a replicated result as P(None,)
    new = tg.apply_updates(_params(mesh), _grads(mesh))
    tg.check(new, spec)


def test_an_axis_type_mismatch_names_both() -> None:
    explicit = cpu_mesh((2, 4), ("x", "y"), KINDS["explicit"])
    auto = cpu_mesh((2, 4), ("x", "y"), KINDS["auto"])
    spec = tg.spec_of(_params(auto), sharding=True)
    with pytest.raises(tg.TreeMismatchError) as e:
        tg.check(_params(explicit), spec)
    assert {m.kind for m in e.value.mismatches} == {"sharding"}
    assert (
        "['w']: sharding named(mesh[x=2,y=4], spec('x', 'y')) in the spec, "
        "named(mesh[x=2:Explicit,y=4:Explicit], spec('x', 'y')) in the tree"
    ) in str(e.value)


def test_an_old_spec_without_axis_types_still_loads_and_matches_auto() -> None:
    auto = cpu_mesh((2, 4), ("x", "y"), KINDS["auto"])
    tree = {"w": jax.device_put(jnp.ones((8, 8)), NamedSharding(auto, P("x", None)))}
    old = tg.spec_of(
        {"w": tg.LeafSpec((8, 8), "float32", sharding="named(mesh[x=2,y=4], spec('x', None))")}
    )
    tg.check(tree, tg.TreeSpec.from_json(old.to_json()))
    explicit = cpu_mesh((2, 4), ("x", "y"), KINDS["explicit"])
    moved = {"w": jax.device_put(jnp.ones((8, 8)), NamedSharding(explicit, P("x", None)))}
    with pytest.raises(tg.TreeMismatchError, match="x=2:Explicit"):
        tg.check(moved, old)


@pytest.mark.parametrize(
    "text",
    [
        "named(mesh[x=2,y=4], spec(" + "(" * 300 + ")" * 300 + "))",
        "named(mesh[x=2,y=4], spec(" + "'x', " * 5000 + "))",
        "named(mesh[x=2,y=4], spec(__import__('os').getcwd()))",
        "named(mesh[x=2,y=4], spec('x\x1b[31m',))",
    ],
    ids=["deep", "huge", "code", "escape"],
)
def test_a_hostile_sharding_text_is_compared_as_written(text: str) -> None:
    auto = cpu_mesh((2, 4), ("x", "y"), KINDS["auto"])
    tree = {"w": jax.device_put(jnp.ones((8, 8)), NamedSharding(auto, P("x")))}
    spec = tg.TreeSpec.from_json(
        tg.spec_of({"w": tg.LeafSpec((8, 8), "float32", sharding=text)}).to_json()
    )
    with pytest.raises(tg.TreeMismatchError) as e:
        tg.check(tree, spec)
    assert [m.kind for m in e.value.mismatches] == ["sharding"]
    assert e.value.mismatches[0].expected == text


# -- maps and updates ------------------------------------------------------


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_updates_keep_the_params_shardings(mesh: jax.sharding.Mesh, context: str) -> None:
    params, grads = _params(mesh), _grads(mesh)
    with CONTEXTS[context](mesh):
        new = tg.apply_updates(params, jax.tree.map(lambda g: -g, grads))
        _same_shardings(new, params)
        np.testing.assert_array_equal(np.asarray(new["w"]), np.arange(64.0).reshape(8, 8) - 1)
        step = tg.updater(lambda p, g, *, lr: p - lr * g)
        out = params
        for _ in range(3):
            out = step(out, grads, lr=0.5)
        _same_shardings(out, params)
        np.testing.assert_array_equal(np.asarray(out["b"]), np.arange(8.0) - 1.5)
        assert step.compile_count == 1
        mapped = tg.tree_map(lambda p, g: p * g, params, grads)
        _same_shardings(mapped, params)


def test_an_update_laid_out_otherwise_is_moved_to_the_params_layout(
    mesh: jax.sharding.Mesh,
) -> None:
    params = _params(mesh)
    other = _grads(mesh, {"w": P("y", "x"), "b": P(), "scale": P()})
    new = tg.apply_updates(params, other)
    _same_shardings(new, params)
    np.testing.assert_array_equal(np.asarray(new["w"]), np.arange(64.0).reshape(8, 8) + 1)
    step = tg.updater(lambda p, g: p - g, on_nonfinite="skip", donate=True)
    out = step(jax.tree.map(lambda x: x + 0, params), other)
    _same_shardings(out, params)


def test_an_update_on_another_axis_type_is_a_sharding_mismatch() -> None:
    explicit = cpu_mesh((2, 4), ("x", "y"), KINDS["explicit"])
    auto = cpu_mesh((2, 4), ("x", "y"), KINDS["auto"])
    with pytest.raises(tg.TreeMismatchError) as e:
        tg.apply_updates(_params(explicit), _grads(auto))
    assert {m.kind for m in e.value.mismatches} == {"sharding"}
    assert (
        "['b']: sharding named(mesh[x=2:Explicit,y=4:Explicit], spec('y',)) on cpu:0-7 in the "
        "params, named(mesh[x=2,y=4], spec('y',)) on cpu:0-7 in the updates"
    ) in str(e.value)


def test_a_layout_jax_refuses_in_tree_map_names_the_leaf() -> None:
    explicit = cpu_mesh((2, 4), ("x", "y"), KINDS["explicit"])
    a = _params(explicit)
    b = _grads(explicit, {"w": P("y", "x"), "b": P("y"), "scale": P()})
    with pytest.raises(tg.InvalidTreeError) as e:
        tg.tree_map(lambda p, g: p + g, a, b)
    assert e.value.path == "['w']"
    text = str(e.value)
    assert text.startswith(
        "1 invalid leaf or node in the tree:\n"
        "  ['w']: f32[8,8] sharded named(mesh[x=2:Explicit,y=4:Explicit], spec('x', 'y')) on "
        "cpu:0-7 in tree 0, f32[8,8] sharded named(mesh[x=2:Explicit,y=4:Explicit], "
        "spec('y', 'x')) on cpu:0-7 in tree 1: JAX refused it: "
    ), text
    assert "hint: put every tree on its params' shardings" in text


def test_a_layout_jax_refuses_inside_an_update_rule_names_the_leaf() -> None:
    explicit = cpu_mesh((2, 4), ("x", "y"), KINDS["explicit"])
    params = _params(explicit)

    def transposing(p: Any, g: Any) -> Any:
        return p - g.T if p.ndim == 2 else p - g  # P('y','x') against P('x','y')

    with pytest.raises(tg.InvalidTreeError) as e:
        tg.updater(transposing)(params, _grads(explicit))
    assert e.value.path == "['w']"
    assert "spec('x', 'y')) on cpu:0-7 in the params, f32[8,8] sharded " in str(e.value)
    assert "in the updates: JAX refused it: " in str(e.value)


def test_a_nan_is_found_and_refused(mesh: jax.sharding.Mesh) -> None:
    params = _params(mesh)
    bad = _put(
        {
            "w": np.where(np.eye(8) > 0, np.nan, 1).astype(np.float32),
            "b": np.ones(8, np.float32),
            "scale": np.float32(np.inf),
        },
        mesh,
    )
    assert tg.find_nonfinite(bad) == {"['w']": 8, "['scale']": 1}
    assert tg.find_nonfinite(params) == {}
    with pytest.raises(tg.NonFiniteError) as e:
        tg.updater(lambda p, g: p - g)(params, bad)
    assert e.value.counts == {"['w']": 8, "['scale']": 1}
    skip = tg.updater(lambda p, g: p - g, on_nonfinite="skip")
    kept = skip(params, bad)
    assert skip.skipped == 1
    np.testing.assert_array_equal(np.asarray(kept["w"]), np.asarray(params["w"]))
    _same_shardings(kept, params)


def test_a_tree_over_two_kinds_of_mesh_is_searched_leaf_by_leaf() -> None:
    explicit = cpu_mesh((2, 4), ("x", "y"), KINDS["explicit"])
    auto = cpu_mesh((2, 4), ("x", "y"), KINDS["auto"])
    tree = {
        "a": jax.device_put(jnp.full((8, 8), jnp.nan), NamedSharding(explicit, P("x", "y"))),
        "b": jax.device_put(jnp.ones((8, 8)), NamedSharding(auto, P("x", "y"))),
    }
    assert tg.find_nonfinite(tree) == {"['a']": 64}
    finite = jax.device_put(jnp.ones((8, 8)), NamedSharding(explicit, P("x", "y")))
    assert tg.find_nonfinite({"b": tree["b"], "c": finite}) == {}


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_optax_steps_keep_shardings_and_compile_once(mesh: jax.sharding.Mesh, context: str) -> None:
    params, grads = _params(mesh), _grads(mesh)
    with CONTEXTS[context](mesh):
        step = tg.optax_step(optax.adam(1e-2))
        state = step.init(params)
        for _ in range(3):
            params, state = step(params, grads, state)
    _same_shardings(params, _params(mesh))
    assert step.compile_count == 1
    assert tg.find_nonfinite(state) == {}


def test_inside_shard_map_the_step_runs_on_each_shard(mesh: jax.sharding.Mesh) -> None:
    step = tg.updater(lambda p, g: p - g, on_nonfinite="skip")
    specs = {"w": P("x", "y"), "b": P("y"), "scale": P()}

    def body(p: Any, g: Any) -> Any:
        total = sum(jax.tree.leaves(tg.count_nonfinite(g)))
        return step(p, g), total[None]

    run = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(specs, specs), out_specs=(specs, P(("x", "y"))))
    )
    new, counts = run(_params(mesh), _grads(mesh))
    np.testing.assert_array_equal(np.asarray(new["w"]), np.arange(64.0).reshape(8, 8) - 1)
    assert counts.shape == (8,) and not np.asarray(counts).any()
    _same_shardings(new, _params(mesh))
    with pytest.raises(tg.TracedValueError):
        jax.shard_map(
            lambda p, g: tg.updater(lambda a, b: a - b)(p, g),
            mesh=mesh,
            in_specs=(specs, specs),
            out_specs=specs,
        )(_params(mesh), _grads(mesh))


# -- the bundled models ----------------------------------------------------


def _replicated(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """The first axis of each leaf split over ``x`` where it divides, else replicated."""

    def spec(x: Any) -> Any:
        return P("x") if x.ndim and x.shape[0] % 2 == 0 else P()

    return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), tree)


@pytest.mark.slow
@pytest.mark.parametrize("example", [cnn, eqx_mlp], ids=["nnx-cnn", "eqx-mlp"])
def test_the_bundled_models_train_on_every_mesh(mesh: jax.sharding.Mesh, example: Any) -> None:
    host = example.init(jax.random.key(0))
    params = _replicated(host, mesh)
    batch = jax.tree.map(lambda x: jnp.asarray(x[:8]), example.splits()["train"])
    spec = tg.spec_of(params, sharding=True)
    step = tg.optax_step(optax.sgd(1e-2))
    state = step.init(params)
    # the model's own forward pass is not written for sharded-typed params; its
    # gradient is taken on one device and moved onto the params' shardings
    grads = jax.jit(jax.grad(example.loss))(host, batch)
    grads = jax.tree.map(lambda g, p: jax.device_put(g, p.sharding), grads, params)
    new, state = step(params, grads, state)
    tg.check(new, spec)
    assert tg.find_nonfinite(new) == {}
    again = tg.apply_updates(new, jax.tree.map(jnp.zeros_like, grads))
    tg.check(again, spec)
    assert isinstance(new, type(params))
    if example is eqx_mlp:
        assert eqx.tree_equal(jax.tree.structure(new), jax.tree.structure(params))
