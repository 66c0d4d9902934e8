"""Proof that every check can fail: one broken variant of the bundled example
per check. Each variant fails exactly its own check, with evidence that names
the cause.

Variants whose bug changes the model's numbers get references recorded from
the same buggy code (as when a bug predates the references), so that the
regression check does not fail too; the others run against the shipped
references.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from machine import cpu_devices

from treeguard.examples import mlp
from treeguard.verify import CHECKS, record_references, run

BASE = mlp.model


def _verify(model: Any, tmp_path: Path, *, own_references: bool) -> Any:
    refs = None
    if own_references:
        refs = record_references(model, tmp_path / "refs.safetensors")
    return run(model, references=refs, bench=False)


def _assert_only(report: Any, name: str) -> list[str]:
    statuses = {c.name: c.status for c in report.checks}
    assert report.failed == [name], statuses
    assert report.exit_code == 1
    return report[name].evidence


# -- keys ------------------------------------------------------------------------


def _init_reusing_k1(key: jax.Array) -> Any:
    k1, _k2 = jax.random.split(key)
    return {
        "dense1": {"w": jax.random.normal(k1, (2, 3)) / jnp.sqrt(2.0), "b": jnp.zeros(3)},
        "dense2": {"w": jax.random.normal(k1, (3, 1)) / jnp.sqrt(3.0), "b": jnp.zeros(1)},
    }


@pytest.mark.slow
def test_legacy_key_reused_fails_keys_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, init=_init_reusing_k1, key_kind="legacy")
    evidence = _assert_only(_verify(model, tmp_path, own_references=True), "keys")
    # JAX's checker cannot see a legacy uint32 key; treeguard's tracking can.
    assert not any("JAX's key-reuse checker" in e for e in evidence)
    reuse = next(e for e in evidence if "consumed twice" in e)
    assert reuse.startswith("init: legacy uint32 key split[0] of the key passed to init")
    assert "test_broken_variants.py" in reuse and "(_init_reusing_k1)" in reuse


def test_typed_key_reused_fails_keys_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, init=_init_reusing_k1)
    evidence = _assert_only(_verify(model, tmp_path, own_references=True), "keys")
    assert any(e.startswith("init: JAX's key-reuse checker: ") for e in evidence)
    assert any(e.startswith("init: key split[0] of the key passed to init") for e in evidence)


# -- finite ----------------------------------------------------------------------


def _loss_normalised(params: Any, batch: Any) -> jax.Array:
    # Normalised by the inputs' energy: 0 / 0 on the all-zeros case.
    return mlp.loss(params, batch) / jnp.mean(batch["x"] ** 2)


def test_nan_loss_fails_finite_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, loss=_loss_normalised)
    evidence = _assert_only(_verify(model, tmp_path, own_references=True), "finite")
    assert evidence[0] == "case 'zeros' loss is non-finite: nan"
    assert any(e.startswith("case 'zeros' grads ['dense1']['w'] f32[2,3]") for e in evidence)
    assert not any("'standard'" in e for e in evidence)


# -- contract --------------------------------------------------------------------


def _apply_flat(params: Any, batch: Any) -> jax.Array:
    return mlp.apply(params, batch)[:, 0]  # (B,) where the contract says (B, 1)


def test_wrong_output_shape_fails_contract_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, apply=_apply_flat)
    evidence = _assert_only(_verify(model, tmp_path, own_references=True), "contract")
    assert evidence[0] == (
        "case 'standard' outputs: <root>: shape ('B', 1) in the output spec, (8,) in apply's outputs"
    )


# -- transforms ------------------------------------------------------------------


def _apply_fast_under_jit(params: Any, batch: Any) -> jax.Array:
    x = batch["x"]
    if type(x).__name__ == "DynamicJaxprTracer":
        # A "fast path" taken only when compiled: the first layer in bfloat16.
        w = params["dense1"]["w"].astype(jnp.bfloat16)
        h = jnp.tanh((x.astype(jnp.bfloat16) @ w).astype(jnp.float32) + params["dense1"]["b"])
        return h @ params["dense2"]["w"] + params["dense2"]["b"]
    return mlp.apply(params, batch)


@pytest.mark.slow
def test_jit_differs_fails_transforms_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, apply=_apply_fast_under_jit)
    # on the CPU device: a TPU's eager matmuls round to bfloat16 as well, by default
    with jax.default_device(cpu_devices(1)[0]):
        report = _verify(model, tmp_path, own_references=True)
    evidence = _assert_only(report, "transforms")
    assert evidence[0].startswith("worst leaf: case ")
    assert ", jit vs eager: " in evidence[0] and "beyond tolerance" in evidence[0]
    assert any(
        e.startswith("case 'standard' outputs, jit vs eager: <root> f32[8,1]") for e in evidence
    )
    assert not any("vmap vs eager" in e for e in evidence)


# -- negative --------------------------------------------------------------------


def _apply_truncating(params: Any, batch: Any) -> jax.Array:
    x = batch["x"][..., : mlp.IN]  # silently drops extra features instead of refusing them
    return mlp.apply(params, {**batch, "x": x})


def test_invalid_input_returning_fails_negative_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, apply=_apply_truncating)
    evidence = _assert_only(_verify(model, tmp_path, own_references=False), "negative")
    assert evidence == [
        "invalid case 'invalid_shape' (['x'] is f32[8,3] where the contract says f32[B,2]): "
        "returned f32[8,1] instead of raising ValueError"
    ]


# -- regression ------------------------------------------------------------------


def _init_drifted(key: jax.Array) -> Any:
    params = mlp.init(key)
    params["dense2"]["w"] = params["dense2"]["w"] * 1.01  # drifted by 1%
    return params


def test_drifted_weights_fail_regression_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, init=_init_drifted)
    evidence = _assert_only(_verify(model, tmp_path, own_references=False), "regression")
    assert evidence[0].startswith(
        "params: ['dense2']['w'] f32[3,1]: 3 of 3 elements beyond tolerance, max abs err "
    )
    assert not any("['dense1']['w'] f32[2,3]: " in e and e.startswith("params") for e in evidence)
    assert any(e.startswith("case 'standard' outputs: <root> f32[8,1]") for e in evidence)


# -- training --------------------------------------------------------------------


def _update_ascending(params: Any, grads: Any) -> Any:
    return jax.tree.map(lambda p, g: p + mlp.LEARNING_RATE * g, params, grads)


def test_update_raising_loss_fails_training_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, update=_update_ascending)
    evidence = _assert_only(_verify(model, tmp_path, own_references=False), "training")
    assert evidence[0].startswith("loss went ")
    assert "it did not decrease; hint: check the sign and the step size of update" in evidence[0]


def _update_casting(params: Any, grads: Any) -> Any:
    return jax.tree.map(lambda p, g: (p - 0.01 * g).astype(jnp.bfloat16), params, grads)


def test_update_changing_dtype_fails_training(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, update=_update_casting)
    report = _verify(model, tmp_path, own_references=False)
    assert "training" in report.failed
    assert report["training"].evidence[0] == (
        "step 1 params: ['dense1']['b']: dtype float32 in init's params, bfloat16 in the updated params"
    )


# -- splits ----------------------------------------------------------------------


def _overlapping_splits() -> dict[str, Any]:
    data = mlp.splits()
    data["val"] = {k: v.copy() for k, v in data["val"].items()}
    data["val"]["x"][3] = data["train"]["x"][0]
    data["val"]["y"][3] = data["train"]["y"][0]
    return data


def test_overlapping_splits_fail_splits_only(tmp_path: Path) -> None:
    model = dataclasses.replace(BASE, splits=_overlapping_splits)
    evidence = _assert_only(_verify(model, tmp_path, own_references=False), "splits")
    assert len(evidence) == 1
    assert evidence[0].startswith("example 3 of 'val' is example 0 of 'train' (sha256 ")


@pytest.mark.parametrize(
    "name",
    CHECKS,
)
def test_the_sound_example_passes_every_check(name: str) -> None:
    report = _sound_report()
    expected = "skip" if name == "performance" else "pass"  # the example sets no budgets
    assert report[name].status == expected, report[name].evidence


_CACHE: dict[str, Any] = {}


def _sound_report() -> Any:
    if "r" not in _CACHE:
        _CACHE["r"] = run(BASE, bench=False)
    return _CACHE["r"]
