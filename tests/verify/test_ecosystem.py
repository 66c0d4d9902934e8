"""The bundled flax.nnx CNN and equinox MLP verify end to end, trained with optax."""

from __future__ import annotations

from pathlib import Path

import pytest

from treeguard.verify import run


@pytest.mark.slow
def test_the_nnx_cnn_passes_against_its_shipped_references() -> None:
    from treeguard.examples import cnn

    report = run(cnn.model, bench=False)
    assert report.exit_code == 0, {c.name: c.evidence for c in report.checks if not c.passed}
    assert report["regression"].summary == (
        "48 leaves on 4 cases and the params match cnn.regression.safetensors"
    )
    assert report["training"].summary.endswith("params and optimizer state keep their specs")
    assert report["contract"].evidence[0] == "params: 8 leaves, 3658 values (no stored spec)"


@pytest.mark.slow
def test_the_equinox_mlp_records_then_matches(tmp_path: Path) -> None:
    from treeguard.examples import eqx_mlp

    refs = tmp_path / "eqx.safetensors"
    assert run(eqx_mlp.model, bench=False, record=True, references=refs).exit_code == 0
    report = run(eqx_mlp.model, bench=False, references=refs)
    assert report.exit_code == 0
    assert report["regression"].summary.endswith("and the params match eqx.safetensors")
