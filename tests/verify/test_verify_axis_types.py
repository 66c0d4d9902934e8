"""The acceptance protocol on a model whose params live on a mesh of each
axis type (Explicit, Auto, mixed), on 8 CPU devices in process: the compiled
programs and the eager reference of the ``transforms`` check both run."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from treeguard.examples import mlp
from treeguard.verify import run

KINDS = {
    "explicit": (AxisType.Explicit, AxisType.Explicit),
    "auto": (AxisType.Auto, AxisType.Auto),
    "mixed": (AxisType.Explicit, AxisType.Auto),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_verify_passes_with_params_on_every_axis_type(kind: str) -> None:
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=KINDS[kind])
    replicated = NamedSharding(mesh, P())

    def init(key: jax.Array) -> Any:
        return jax.device_put(mlp.init(key), replicated)

    report = run(dataclasses.replace(mlp.model, init=init), bench=False)
    assert report.failed == [], [(c, report[c].evidence) for c in report.failed]
    assert report["transforms"].status == "pass"
