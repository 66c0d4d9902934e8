"""A version whose params hold NaN is refused at every gate, whatever its
float kind: bfloat16 (the TPU's own), float16, float32 and float8, whose
dtype kind ``'V'`` the serving gate once skipped, so a bf16 version with a
NaN was loaded and served and each request's 422 blamed the input.

A bfloat16 model goes through verify, the store and the server here, and
its NaN variant is refused at each of them."""

from __future__ import annotations

import json
from typing import Any

import floatmodel
import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from serving_support import client

import treeguard
from treeguard._cli.main import main
from treeguard.serving import Server, ServingError, ServingSpec
from treeguard.verify import run

pytestmark = pytest.mark.anyio

#: The float kinds a version's params may have here, each with its short name.
DTYPES = [
    (ml_dtypes.bfloat16, "bf16"),
    (np.float16, "f16"),
    (np.float32, "f32"),
    (ml_dtypes.float8_e4m3fn, "float8_e4m3fn"),
    (ml_dtypes.float8_e5m2, "float8_e5m2"),
]


def _spec(model: Any) -> ServingSpec:
    return ServingSpec.from_model(model, name="dense", buckets=(1, 4))


def _row(rows: int) -> dict[str, Any]:
    data = [0.5, -0.25] * rows
    return {"inputs": [{"name": "x", "shape": [rows, 2], "datatype": "FP32", "data": data}]}


def _finite_refusal(version: str, short: str) -> str:
    return (
        f"version {version} fails the finite check: 1 leaf holds NaN or Inf in the params of "
        f"version {version}:\n  ['dense']['w']: 1 of 6 values ({short}[2,3])\n"
        "hint: it must not be served: verify and promote a version whose params are finite"
    )


@pytest.mark.parametrize(("dtype", "short"), DTYPES, ids=[s for _, s in DTYPES])
async def test_a_version_holding_nan_is_refused_at_load_naming_the_check_path_and_dtype(
    tmp_path, caplog, dtype, short
):
    model = floatmodel.make(dtype)
    store = treeguard.ArtifactStore(tmp_path / "s")
    good = store.put(floatmodel.params(dtype))
    store.verify(good)
    store.promote(good)
    nan = store.put(floatmodel.params(dtype, nan=True))
    assert store.verify(nan).status == "verified"  # integrity only: no model check ran
    server = Server(model, store, spec=_spec(model), allow_unchecked=True)
    async with client(server) as c:
        r = await c.post("/v2/treeguard/swap", json={"version": nan})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == _finite_refusal(nan, short)
        assert server.status()["active"] == good
        # the same refusal to a caller in process, its fields apart from its text
        with pytest.raises(ServingError) as refused:
            await server.swap(nan)
        assert str(refused.value) == _finite_refusal(nan, short)
        assert (refused.value.version, refused.value.dtypes) == (nan, {"['dense']['w']": short})
        assert refused.value.counts == {"['dense']['w']": 1} and refused.value.status == 409
        r = await c.post("/v2/models/dense/infer", json=_row(3))
        assert r.status_code == 200, r.text  # the good version still serves, finite
        assert r.json()["model_version"] == good
    # the same gate when the NaN version is the current one at start: the
    # server falls back to the previous verified version, and says why
    store.promote(nan)
    with caplog.at_level("WARNING", logger="treeguard.serving"):
        restarted = Server(model, store, spec=_spec(model), allow_unchecked=True)
        restarted.start()
    assert restarted.status()["active"] == good
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fell back")]
    assert said == [
        f"fell back from {nan} to {good}: "
        + _finite_refusal(nan, short).split("\nhint")[0].replace(":\n  ", ":; ")
    ]


def _store_verify(root: Any, version: str) -> Any:
    return CliRunner().invoke(
        main, ["store", "verify", str(root), version, "--model", "floatmodel:model"]
    )


@pytest.mark.slow
async def test_a_bf16_model_goes_through_verify_store_and_serve(tmp_path):
    model = floatmodel.model
    # 1. the verify protocol: references recorded, then matched; the NaN variant fails `finite`
    refs = tmp_path / "refs.npz"
    assert run(model, record=True, references=refs, bench=False).exit_code == 0
    report = run(model, references=refs, bench=False)
    assert report.exit_code == 0, report
    bad = run(floatmodel.make(nan=True), references=refs, bench=False)
    by = {c.name: c for c in bad.checks}
    assert by["finite"].status == "fail", by["finite"]
    assert "case 'standard' grads ['dense']['w'] bf16[2,3]: 2 of 6 non-finite (nan)" in (
        by["finite"].evidence
    )
    # 2. the store: the model's release checks pass the good version, refuse the NaN one
    store = treeguard.ArtifactStore(tmp_path / "s")
    good = store.put(model.init(model.key()))
    out = _store_verify(store.root, good)
    assert out.exit_code == 0, out.output
    nan = store.put(floatmodel.params(nan=True))
    out = _store_verify(store.root, nan)
    assert out.exit_code == 1, out.output
    assert "check model.finite raised ValueError: NaN or Inf in ['dense']['w']" in " ".join(
        out.output.split()
    )
    assert store.info(nan).status == "rejected"
    store.promote(good)
    ls = json.loads(CliRunner().invoke(main, ["store", "ls", str(store.root), "--json"]).output)
    checks = {v["version"]: v["checks"] for v in ls["versions"]}
    assert checks[good] == ["model.contract", "model.finite", "model.outputs"]
    # 3. the server: the bf16 version serves bf16 outputs; the NaN one is refused at load
    sneaked = store.put(floatmodel.params(nan=True))
    store.verify(sneaked)  # verified without the model's checks
    server = Server(model, store, spec=_spec(model), allow_unchecked=True)
    async with client(server) as c:
        r = await c.post("/v2/models/dense/infer", json=_row(2))
        assert r.status_code == 200, r.text
        (output,) = r.json()["outputs"]
        assert output["datatype"] == "BF16" and output["shape"] == [2, 3]
        assert all(np.isfinite(output["data"]))
        r = await c.post("/v2/treeguard/swap", json={"version": sneaked})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == _finite_refusal(sneaked, "bf16")
        r = await c.post("/v2/models/dense/infer", json=_row(1))
        assert r.status_code == 200 and r.json()["model_version"] == good
