"""``diagnose --bundle`` replays a step whose loss draws dropout from its PRNG
key with the key the bundle recorded, through the CLI in a subprocess."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from subproc import ROOT, run_module

import treeguard as tg
from treeguard.diagnose import DiagnosisError, replay_bundle

from . import keyed

BAD = {"x": jnp.array([[0.1, 0.2, 0.3, 1.0], [0.0, 0.5, -0.5, 0.2]], jnp.float32)}


def _bundle(tmp_path: Path, loss: Any = keyed.loss, key: Any = None) -> str:
    recorder = tg.FlightRecorder(tmp_path / "nan", batch="record")
    train = recorder.wrap(tg.optax_step(keyed.model.optimizer), loss=loss)
    params = keyed.init(None)
    with pytest.raises(tg.NonFiniteError) as info:
        if key is None:
            train(params, train.init(params), BAD)
        else:
            train(params, train.init(params), BAD, key=key)
    assert info.value.bundle is not None
    return info.value.bundle


@pytest.mark.slow
def test_diagnose_bundle_replays_a_keyed_step_through_the_cli(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, key=jax.random.key(3))
    assert tg.read_bundle(bundle).has_key
    env = {
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "diagnose")]
        )
    }
    done = run_module(
        "treeguard", ["diagnose", "keyed:model", "--bundle", bundle, "--json"], env=env
    )
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["stage"] == "loss"
    assert out["sites"][0]["primitive"] == "log"
    line = (
        Path(keyed.__file__)
        .read_text()
        .splitlines()
        .index('    barrier = jnp.mean(jnp.log(1.0 - batch["x"]))  # NaN is born here')
    )
    assert out["sites"][0]["source"] == f"keyed.py:{line + 1} (loss)"


def test_a_keyed_loss_and_a_bundle_without_a_key_are_refused(tmp_path: Path) -> None:
    def unkeyed(params: Any, batch: Any) -> Any:
        return keyed.loss(params, batch, jax.random.key(0))

    bundle = _bundle(tmp_path, loss=unkeyed)
    with pytest.raises(DiagnosisError) as info:
        replay_bundle(bundle, keyed.model)
    assert str(info.value) == (
        f"{bundle}: the model's loss takes a PRNG key, and the bundle recorded none\n"
        "hint: record the step with its key: train(params, state, batch, key=key)"
    )


def test_a_bundle_with_a_key_and_a_loss_without_one_are_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, key=jax.random.key(3))
    unkeyed = dataclasses.replace(keyed.model, loss=lambda p, b: keyed.loss(p, b, None))
    with pytest.raises(DiagnosisError) as info:
        replay_bundle(bundle, unkeyed)
    assert str(info.value) == (
        f"{bundle}: the bundle recorded the step's PRNG key, and the model's loss takes none\n"
        "hint: give the model the loss the step ran: loss(params, batch, key)"
    )
