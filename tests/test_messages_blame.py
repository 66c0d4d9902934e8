"""Pinned messages of errors that must blame the right thing: the type, the
leaf or key it concerns, and the fix."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import pytest
from click.testing import CliRunner
from subproc import run_python

import treeguard as tg
from treeguard._cli.main import main

BIG = 10**5000  # more digits than Python will turn into text


def _raises(kind: type[BaseException], fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(kind) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_a_5000_digit_int_key_is_named_not_a_bare_value_error(tmp_path: Path) -> None:
    spec = tg.spec_of({"a": {BIG: jnp.ones(2)}})
    assert repr(spec) == "TreeSpec(['a'][<int of 5001 digits>]: f32[2])"
    assert _raises(tg.InvalidTreeError, spec.to_json) == (
        "1 invalid leaf or node in the tree:\n"
        "  ['a']: key <int of 5001 digits> is too long for a spec to read back\n"
        "hint: use str keys, or int keys of at most 20 digits"
    )
    assert _raises(tg.TreeMismatchError, tg.check, {"a": {BIG: jnp.ones(3)}}, spec) == (
        "1 mismatch between the tree and the spec:\n"
        "  ['a'][<int of 5001 digits>]: shape (2,) in the spec, (3,) in the tree\n"
        "hint: an array of another shape would be broadcast or mis-assigned; fix it where it "
        "is built"
    )
    message = _raises(tg.InvalidTreeError, tg.save, tmp_path / "a.safetensors", {BIG: jnp.ones(2)})
    assert message.startswith(
        "1 invalid leaf or node in the tree:\n"
        "  <root>: key of 5001 digits is too long to read back from a spec\n"
    )


def test_a_5000_digit_int_in_metadata_is_a_type_error_naming_it(tmp_path: Path) -> None:
    message = _raises(
        TypeError,
        tg.save,
        tmp_path / "a.safetensors",
        {"w": jnp.ones(2)},
        metadata={"a": [1, {"b": BIG}]},
    )
    assert message == (
        "metadata['a'][1]['b']: an integer of 5001 digits is too long to read back\n"
        "hint: metadata holds JSON values only: str, finite numbers, bool, None, lists, dicts"
    )


INDIVISIBLE = """
import sys, jax, jax.numpy as jnp, numpy as np
import treeguard as tg
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
tg.save_sharded(sys.argv[1], {"w": jnp.arange(10.0), "b": jnp.ones(8)})
like = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, P("data")))
        for k, s in (("w", (10,)), ("b", (8,)))}
try:
    tg.load_sharded(sys.argv[1], like)
except tg.InvalidTreeError as e:
    print(e)
"""


def test_load_sharded_onto_a_sharding_that_does_not_divide_blames_like(tmp_path: Path) -> None:
    proc = run_python(
        INDIVISIBLE,
        str(tmp_path / "ck"),
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{tmp_path / 'ck'}: 1 invalid leaf or node in the tree:"
    # after the prefix, JAX's own words, which differ between jax versions
    assert lines[1].startswith("  ['w']: the sharding of `like` cannot hold f32[10]: ")
    assert "NamedSharding(" in lines[1]
    assert "the dimension size is 10" in lines[1]
    assert lines[2] == (
        "hint: give each such leaf of `like` a sharding whose mesh axes divide its "
        "dimensions (P() replicates it); the checkpoint itself is fine"
    )
    assert "IntegrityError" not in proc.stdout + proc.stderr


def test_a_like_of_none_leaves_gets_the_filter_hint(tmp_path: Path) -> None:
    import equinox as eqx
    import jax

    model = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    tg.save_sharded(tmp_path / "ck", eqx.filter(model, eqx.is_array))
    shapes = eqx.filter_eval_shape(eqx.nn.Linear, 2, 3, key=jax.random.key(0))
    message = _raises(
        tg.TreeMismatchError, tg.load_sharded, tmp_path / "ck", eqx.filter(shapes, eqx.is_array)
    )
    assert message.splitlines()[-1] == (
        "hint: `like` holds None where the checkpoint holds arrays: a filter dropped them "
        "(eqx.filter(eqx.filter_eval_shape(...), eqx.is_array) keeps no jax.ShapeDtypeStruct, "
        "so every leaf becomes None); keep the shapes with eqx.filter(shapes, lambda x: "
        "isinstance(x, jax.ShapeDtypeStruct)), or pass the unfiltered tree"
    )
    assert ".weight: node type none in `like`, leaf f32[3,2] in the checkpoint" in message


WIDE = """
import dataclasses

import jax
import jax.numpy as jnp

from treeguard import LeafSpec, spec_of
from treeguard.examples import mlp


def init(key):
    k1, k2 = jax.random.split(key)
    return {
        "dense1": {"w": jax.random.normal(k1, (3, 3)), "b": jnp.zeros(3)},
        "dense2": {"w": jax.random.normal(k2, (3, 1)), "b": jnp.zeros(1)},
    }


def apply(params, batch):
    x = batch["x"]
    if x.shape[-1] != 3:
        raise ValueError(f"batch['x'] must have shape (B, 3), got {tuple(x.shape)}")
    h = jnp.tanh(x @ params["dense1"]["w"] + params["dense1"]["b"])
    return h @ params["dense2"]["w"] + params["dense2"]["b"]


def loss(params, batch):
    return jnp.mean((apply(params, batch) - batch["y"]) ** 2)


model = dataclasses.replace(
    mlp.model,
    init=init,
    apply=apply,
    loss=loss,
    batch_spec=spec_of({"x": LeafSpec(("B", 3), "float32"), "y": LeafSpec(("B", 1), "float32")}),
    references=None,
    params_spec=None,
)
"""


@pytest.mark.slow  # two diagnoses: the whole ladder once, to record the trace
def test_diagnose_against_a_trace_of_another_input_width_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tg_wide.py").write_text(WIDE)
    path_before = list(sys.path)
    try:
        res = CliRunner().invoke(main, ["diagnose", "tg_wide:model", "--record", "t.safetensors"])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(
            main, ["diagnose", "treeguard.examples.mlp:model", "--against", "t.safetensors"]
        )
    finally:
        sys.path[:] = path_before
        sys.modules.pop("tg_wide", None)
    assert res.exit_code == 2, res.output
    assert res.stderr == (
        "error: the function does not take the trace's 6 inputs (float32[3], float32[3, 3], "
        "float32[1], float32[3, 1], float32[8, 3], float32[8, 1]): ValueError: batch['x'] must "
        "have shape (B, 2), got (8, 3)\n"
        "hint: compare with the function value_and_grad(loss) of tg_wide:model, on inputs of "
        "the shapes it was recorded with\n"
    )


def test_a_class_renamed_with_a_field_names_the_field_too(tmp_path: Path) -> None:
    import equinox as eqx
    from blame_classes import Dense, Layer

    path = tmp_path / "a.safetensors"
    tg.save(path, Layer(jnp.ones(2), jnp.zeros(2)))
    message = _raises(tg.TreeMismatchError, tg.load, path, like=Dense(jnp.ones(2), jnp.zeros(2)))
    assert message.splitlines()[:4] == [
        f"{path}: 3 mismatches between the checkpoint and `like`:",
        "  <root>: node type blame_classes.Dense in `like`, blame_classes.Layer in the checkpoint",
        "  .bias: missing: f32[2] in `like`, absent in the checkpoint",
        "  .b: unexpected: f32[2] in the checkpoint, absent in `like`",
    ]
    assert issubclass(Dense, eqx.Module)


def test_optax_step_init_on_an_unfiltered_equinox_module_gets_the_equinox_hint() -> None:
    import equinox as eqx
    import jax
    import optax

    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    message = _raises(tg.InvalidTreeError, tg.optax_step(optax.adam(1e-3)).init, model)
    assert message == (
        "2 invalid leaves or nodes in the tree:\n"
        "  .activation: leaf of type custom_jvp is not an array (in the params)\n"
        "  .final_activation: leaf of type function is not an array (in the params)\n"
        "hint: an equinox module holds config beside its arrays (activations, sizes, non-array "
        "fields); take its arrays with `eqx.filter(model, eqx.is_array)` and check or save "
        "those, or mark config fields `eqx.field(static=True)`"
    )
