"""Regression references per backend: a run compares with its own backend's
references, records to its own backend's file beside the CPU's, and against
another backend's references says so in its verdict, never as a bare
regression; a model may declare per-backend tolerances."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import pytest
from forge import forge
from refpaths import references_of

from treeguard import ConfigError
from treeguard.examples import cnn, eqx_mlp, mlp
from treeguard.verify import References, Tolerance, record_references
from treeguard.verify import run as verify

NOW = jax.default_backend()
OTHER = "tpu" if NOW == "cpu" else "cpu"


def cross_backend_summary(recorded: str, device_kind: str | None, now: str) -> str:
    """The verdict of a run against another backend's references, pinned word for word."""
    return (
        f"references recorded on {recorded} ({device_kind}), this run on {now}: record "
        "references for this backend with --record, or declare cross-backend tolerances"
    )


def _recorded_on(path: Path, backend: str, device_kind: str) -> Path:
    """Rewrites the references' environment as if ``backend`` had computed them."""

    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        env = json.loads(meta["treeguard.env"])
        env.update(backend=backend, device_kind=device_kind)
        meta["treeguard.env"] = json.dumps(env)

    forge(path, mutate)
    return path


def _drifted(tmp_path: Path) -> Path:
    """References of the MLP with every param 0.1% off, as another backend's
    arithmetic could leave them."""
    off = dataclasses.replace(
        mlp.model, init=lambda k: jax.tree.map(lambda x: x * 1.001, mlp.init(k))
    )
    return record_references(off, tmp_path / "drifted.safetensors", name="mlp")


def test_another_backends_references_fail_naming_both_backends(tmp_path: Path) -> None:
    refs = _recorded_on(_drifted(tmp_path), OTHER, "TPU v5 lite")
    report = verify(mlp.model, references=refs, bench=False)
    reg = report["regression"]
    assert report.failed == ["regression"]
    assert reg.summary == cross_backend_summary(OTHER, "TPU v5 lite", NOW)
    assert reg.evidence[0].startswith("params: ['dense1']['w'] f32[2,3]: ")  # the differences first
    assert any("not necessarily a regression" in line for line in reg.evidence)


@pytest.mark.slow
def test_declared_cross_backend_tolerances_compare_at_them(tmp_path: Path) -> None:
    refs = _recorded_on(_drifted(tmp_path), OTHER, "TPU v5 lite")
    loose = dataclasses.replace(mlp.model, backend_tolerances={OTHER: Tolerance(1e-2, 1e-2)})
    report = verify(loose, references=refs, bench=False)
    assert report["regression"].status == "pass"
    assert report["regression"].summary.endswith(
        f"(references recorded on {OTHER} (TPU v5 lite), this run on {NOW}, "
        "at the declared cross-backend tolerance)"
    )
    assert report.tolerances[f"backend {OTHER}"] == {"rtol": 0.01, "atol": 0.01}
    tight = dataclasses.replace(mlp.model, backend_tolerances={OTHER: Tolerance(1e-6, 1e-7)})
    failed = verify(tight, references=refs, bench=False)["regression"]
    assert failed.status == "fail" and "difference(s) from the references drifted" in failed.summary
    assert "at the declared cross-backend tolerance" in failed.summary


@pytest.mark.slow
def test_the_same_backends_references_are_a_plain_regression(tmp_path: Path) -> None:
    report = verify(mlp.model, references=_drifted(tmp_path), bench=False)
    assert report["regression"].summary.endswith(
        "difference(s) from the references drifted.safetensors"
    )


@pytest.mark.parametrize("key", ["TPU", "t p u", ""])
def test_a_backend_tolerance_is_keyed_by_a_backend_name(key: str) -> None:
    with pytest.raises(ConfigError, match="name a backend as jax.default_backend"):
        dataclasses.replace(mlp.model, backend_tolerances={key: Tolerance(1e-2, 1e-2)})
    with pytest.raises(ConfigError, match=r"backend_tolerances\['tpu'\] is 0.1"):
        dataclasses.replace(mlp.model, backend_tolerances={"tpu": 0.1})  # type: ignore[dict-item]


def test_a_run_records_to_its_own_backends_file_and_reads_it_first(tmp_path: Path) -> None:
    declared = tmp_path / "m.regression.safetensors"
    model = dataclasses.replace(mlp.model, references=declared)
    # only another backend's references: compared with, and said so
    shutil.copy(
        _recorded_on(_drifted(tmp_path), OTHER, "TPU v5 lite"), references_of(declared, OTHER)
    )
    report = verify(model, bench=False)
    assert report.references == str(references_of(declared, OTHER))
    assert report["regression"].summary == cross_backend_summary(OTHER, "TPU v5 lite", NOW)
    # --record writes this backend's file beside them and leaves theirs alone
    before = references_of(declared, OTHER).read_bytes()
    recorded = verify(model, record=True, bench=False)
    assert recorded.recorded == str(references_of(declared, NOW)) == recorded.references
    assert references_of(declared, OTHER).read_bytes() == before
    again = verify(model, bench=False)
    assert again.exit_code == 0 and again.references == str(references_of(declared, NOW))


@pytest.mark.parametrize("example", [mlp, cnn, eqx_mlp], ids=["mlp", "cnn", "eqx_mlp"])
def test_the_bundled_models_ship_cpu_and_tpu_references(example: Any) -> None:
    declared = Path(example.model.references)
    cpu, tpu = (References.load(references_of(declared, b)) for b in ("cpu", "tpu"))
    assert (cpu.backend, tpu.backend) == ("cpu", "tpu")
    assert tpu.device_kind == "TPU v5 lite"
    assert [c.name for c in cpu.cases] == [c.name for c in tpu.cases]
    # so a run on either backend reads its own file (``run`` prefers it to the declared one)
    assert references_of(declared, NOW).is_file()


def test_the_bundled_mlp_against_the_other_backends_shipped_references_names_both() -> None:
    other = References.load(references_of(mlp.model.references, OTHER))
    report = verify(mlp.model, references=other.path, bench=False)
    assert report.failed == ["regression"]
    assert report["regression"].summary == cross_backend_summary(OTHER, other.device_kind, NOW)
