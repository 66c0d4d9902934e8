"""A user's own models (flax.nnx and equinox, defined in ``usermodels.py``),
exported and verified through the command line, then served by ``treeguard
serve --store`` from another directory where their module cannot be
imported; tritonclient over HTTP and gRPC gets the live model's outputs
within the model's tolerance."""

from __future__ import annotations

import sys
from pathlib import Path

# the serving tests' live server (tests/serving/live.py) and what it imports
sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))

import jax
import numpy as np
import pytest
import usermodels
from click.testing import CliRunner
from live import live_server

import treeguard
from treeguard._cli.main import main

#: Run first in the server's process: the user's module must not be importable there.
NOT_IMPORTABLE = "import importlib.util\nassert importlib.util.find_spec('usermodels') is None\n"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nnx_model", "eqx_model"])
def test_a_users_model_is_served_from_its_artifact_where_its_code_is_not(tmp_path, name):
    httpclient = pytest.importorskip("tritonclient.http")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    model = getattr(usermodels, name)
    store = treeguard.ArtifactStore(tmp_path / "store")
    params = model.init(model.key())
    v = store.put(params)
    runner = CliRunner()
    out = runner.invoke(main, ["export", f"usermodels:{name}", "--store", str(store.root), v])
    assert out.exit_code == 0, out.output
    out = runner.invoke(
        main, ["store", "verify", str(store.root), v, "--model", f"usermodels:{name}"]
    )
    assert out.exit_code == 0, out.output
    store.promote(v)
    x = np.random.default_rng(3).uniform(-1, 1, (5, usermodels.IN)).astype(np.float32)
    live_out = model.apply(params, {"features": x})
    (path, want), *_ = jax.tree.leaves_with_path(live_out)
    output = "scores" if path else "output"
    want = np.asarray(want)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    served = model.name
    with live_server(
        "--store", str(store.root), grpc=True, cwd=elsewhere, before=NOT_IMPORTABLE
    ) as live:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{live.port}")
        assert c.is_model_ready(served, v)
        for binary in (False, True):
            inp = httpclient.InferInput("features", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            r = c.infer(
                served, [inp], outputs=[httpclient.InferRequestedOutput(output, binary_data=binary)]
            )
            np.testing.assert_allclose(r.as_numpy(output), want, rtol=model.rtol, atol=model.atol)
        c.close()
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{live.grpc_port}")
        inp = grpcclient.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        r = g.infer(served, [inp], outputs=[grpcclient.InferRequestedOutput(output)])
        np.testing.assert_allclose(r.as_numpy(output), want, rtol=model.rtol, atol=model.atol)
        assert r.get_response().model_version == v
        g.close()
    assert "Traceback" not in live.log, live.log[-3000:]


def test_a_tampered_artifact_stops_the_server_at_start(tmp_path):
    model = usermodels.eqx_model
    store = treeguard.ArtifactStore(tmp_path / "store")
    v = store.put(model.init(model.key()))
    runner = CliRunner()
    assert (
        runner.invoke(
            main, ["export", "usermodels:eqx_model", "--store", str(store.root), v]
        ).exit_code
        == 0
    )
    assert (
        runner.invoke(
            main, ["store", "verify", str(store.root), v, "--model", "usermodels:eqx_model"]
        ).exit_code
        == 0
    )
    store.promote(v)
    blob = tmp_path / "store" / "versions" / v / "exported.bin"
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF
    blob.write_bytes(bytes(data))
    out = runner.invoke(main, ["serve", "--store", str(store.root), "--port", "0"])
    assert out.exit_code == 1, out.output
    assert "does not match its digest" in out.output and v in out.output
