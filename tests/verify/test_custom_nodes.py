"""The regression check on a model whose params and outputs are custom nodes.

A references file gives namedtuples (and flax structs, equinox modules) back
as dicts, since it never imports a class it names; the check must still
match them, leaf by leaf along key paths, and still see a changed class.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from refpaths import references_of

from treeguard.examples import mlp
from treeguard.verify import Model, run

Dense = collections.namedtuple("Dense", "w b")
Params = collections.namedtuple("Params", "dense1 dense2")
Outputs = collections.namedtuple("Outputs", "y hidden")


def init(key: jax.Array) -> Params:
    k1, k2 = jax.random.split(key)
    return Params(
        Dense(jax.random.normal(k1, (2, 3)) / jnp.sqrt(2.0), jnp.zeros(3)),
        Dense(jax.random.normal(k2, (3, 1)) / jnp.sqrt(3.0), jnp.zeros(1)),
    )


def apply(params: Params, batch: dict[str, jax.Array]) -> Outputs:
    x = batch["x"]
    if x.ndim != 2 or x.shape[-1] != 2:
        raise ValueError(f"batch['x'] must have shape (B, 2), got {tuple(x.shape)}")
    h = jnp.tanh(x @ params.dense1.w + params.dense1.b)
    return Outputs(h @ params.dense2.w + params.dense2.b, h)


def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean((apply(params, batch).y - batch["y"]) ** 2)


def update(params: Params, grads: Any) -> Params:
    new: Params = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    return new


def _model(path: Path) -> Model:
    return Model(
        init=init,
        apply=apply,
        loss=loss,
        update=update,
        batch_spec=mlp.BATCH_SPEC,
        references=path,
        rtol=1e-5,
        atol=1e-6,
        name="namedtuple mlp",
    )


def _init_drifted(key: jax.Array) -> Params:
    p = init(key)
    return p._replace(dense2=p.dense2._replace(w=p.dense2.w * 1.01))


def test_recorded_namedtuple_references_pass_and_catch_a_drift(tmp_path: Path) -> None:
    model = _model(tmp_path / "refs.safetensors")
    recorded = run(model, record=True, bench=False)
    assert recorded.passed, {c.name: c.evidence for c in recorded.checks if not c.passed}
    assert recorded.recorded == str(
        references_of(tmp_path / "refs.safetensors", jax.default_backend())
    )

    again = run(model, bench=False)
    assert again["regression"].status == "pass", again["regression"].evidence
    # 4 params + 4 cases x (2 outputs + loss + 4 grads)
    assert again["regression"].summary.startswith("32 leaves on 4 cases")
    assert again.passed

    drifted = run(dataclasses.replace(model, init=_init_drifted), bench=False)
    assert drifted.failed == ["regression"]
    evidence = drifted["regression"].evidence
    assert evidence[0].startswith(
        "params: .dense2.w f32[3,1]: 3 of 3 elements beyond tolerance, max abs err "
    )
    assert any(e.startswith("case 'standard' outputs: .y f32[8,1]: ") for e in evidence)
    assert not any(e.startswith("case 'standard' outputs: .hidden") for e in evidence)
    assert not any("node type" in e for e in evidence)


def test_a_changed_container_class_still_fails_regression(tmp_path: Path) -> None:
    path = tmp_path / "refs.safetensors"
    assert run(_model(path), record=True, bench=False).passed
    # The dict-params example against references recorded from namedtuples:
    # the same leaves at the same field names, but other classes.
    report = run(dataclasses.replace(mlp.model, references=path), bench=False)
    assert report.failed == ["regression"]
    evidence = report["regression"].evidence
    assert evidence[0] == (
        f"params: <root>: node type {__name__}.Params in the references, dict in this run"
    )
    assert f"case 'standard' outputs: <root>: node type {__name__}.Outputs in the references, " in (
        "\n".join(evidence)
    )
