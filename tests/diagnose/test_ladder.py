"""The stage ladder: each fault stops it at its own stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from treeguard import LeafSpec, spec_of
from treeguard.diagnose import STAGES, diagnose
from treeguard.examples import mlp
from treeguard.verify import Model, record_references

from .broken import broken

# Every stage but keys, whose checker recompiles everything: cheap enough for the default run.
FAST = tuple(s for s in STAGES if s != "keys")


def _statuses(d: Any) -> dict[str, str]:
    return {s.name: s.status for s in d.stages}


def test_a_dtype_change_in_update_is_caught_at_shapes_before_any_number() -> None:
    model = dataclasses.replace(mlp.model, update=broken._update_casting)
    d = diagnose(model, stages=FAST)
    assert d.failed is not None and d.failed.name == "shapes" and d.exit_code == 1
    assert d.failed.evidence[0] == (
        "updated params: ['dense1']['b']: dtype float32 in the params, bfloat16 in "
        "eval_shape(update)"
    )
    after = FAST[FAST.index("shapes") + 1 :]
    assert all(_statuses(d)[s] == "skip" for s in after)


def _init(key: jax.Array) -> dict[str, jax.Array]:
    return {"w": jax.random.normal(key, (2,)), "scale": jnp.ones(())}


def _apply(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> jax.Array:
    return (b["x"] @ p["w"])[:, None] * p["scale"]


def _loss(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean(_apply(p, b) ** 2)


def _update_resetting_scale(p: dict[str, jax.Array], g: dict[str, jax.Array]) -> Any:
    return {"w": p["w"] - 0.1 * g["w"], "scale": jnp.asarray(1.0)}  # a weak-typed scalar


TINY = Model(
    init=_init,
    apply=_apply,
    loss=_loss,
    update=_update_resetting_scale,
    batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32")}),
    output_spec=spec_of(LeafSpec(("B", 1), "float32")),
    rtol=1e-5,
    atol=1e-6,
    name="tiny",
)


def test_a_weak_type_change_is_caught_at_shapes() -> None:
    d = diagnose(TINY, stages=FAST)
    assert d.failed is not None and d.failed.name == "shapes"
    assert d.failed.evidence[0] == (
        "updated params: ['scale']: weak type False in the params, True in eval_shape(update)"
    )


_VARIANTS = [
    ("keys", {"init": broken._init_reusing_k1}, True),
    ("shapes", {"apply": broken._apply_flat}, True),
    ("forward", {"init": broken._init_drifted}, False),
    ("loss", {"loss": broken._loss_normalised}, True),
    ("update", {"update": broken._update_ascending}, False),
    ("shapes", {"update": broken._update_casting}, False),
    ("jit", {"apply": broken._apply_fast_under_jit}, False),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "change", "own_refs"),
    _VARIANTS,
    ids=[
        "key-reuse",
        "output-shape",
        "drifted-weights",
        "nan-loss",
        "ascending-update",
        "casting-update",
        "jit-fast-path",
    ],
)
def test_each_broken_variant_of_the_example_stops_at_its_own_stage(
    tmp_path: Path, stage: str, change: dict[str, Any], own_refs: bool
) -> None:
    model = dataclasses.replace(mlp.model, **change)
    refs = record_references(model, tmp_path / "refs.safetensors") if own_refs else None
    # The keys stage recompiles init and a step under JAX's checker: only where it is the answer.
    d = diagnose(model, references=refs, stages=STAGES if stage == "keys" else FAST)
    assert d.failed is not None and d.failed.name == stage, _statuses(d)
    ran = [s.name for s in d.stages]
    assert all(_statuses(d)[s] == "pass" for s in ran[: ran.index(stage)])
    assert all(_statuses(d)[s] == "skip" for s in ran[ran.index(stage) + 1 :])
    if stage == "loss":
        assert d.failed.evidence[0] == "case 'zeros' loss <root>: 1 non-finite values"
        site = d.failed.nan_sites[0]
        assert (site.primitive, site.kind) == ("div", "nan")
        assert site.source.startswith("test_broken_variants.py:")
        assert site.source.endswith(" (_loss_normalised)")
    if stage == "jit":
        div = d.failed.divergence
        assert div is not None and div.outcome == "trace" and d.exit_code == 1
        assert any("casts float32 to bfloat16" in n for n in div.notes)
