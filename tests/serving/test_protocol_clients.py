"""The Open Inference Protocol with clients nobody here wrote: Triton's
``tritonclient.http`` (JSON and binary tensors) and curl, against a real
``treeguard serve`` on 127.0.0.1, for every bundled example model."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from live import live_server

import treeguard
from treeguard._cli.main import main

MODELS = {
    "mlp": ("treeguard.examples.mlp", "['x']", "x", (2,)),
    "cnn": ("treeguard.examples.cnn", "['image']", "image", (8, 8, 1)),
    "eqx_mlp": ("treeguard.examples.eqx_mlp", "['x']", "x", (2,)),
}


def _store(tmp_path, module):
    model = importlib.import_module(module).model
    store = treeguard.ArtifactStore(tmp_path / "store")
    params = model.init(model.key())
    v = store.put(params)
    out = CliRunner().invoke(
        main, ["store", "verify", str(store.root), v, "--model", f"{module}:model"]
    )
    assert out.exit_code == 0, out.output  # the model's release checks ran
    store.promote(v)
    return model, store, v


@pytest.mark.slow
@pytest.mark.parametrize("which", sorted(MODELS))
def test_tritonclient_http_json_and_binary(tmp_path, which):
    httpclient = pytest.importorskip("tritonclient.http")
    module, path, name, tail = MODELS[which]
    model, store, v = _store(tmp_path, module)
    spec = treeguard.serving.ServingSpec.from_model(
        model, inputs=[path], buckets=(1, 4), name=which
    )
    spec.save(tmp_path / "spec.json")
    args = [f"{module}:model", "--store", str(store.root), "--spec", str(tmp_path / "spec.json")]
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (3, *tail)).astype(np.float32)
    want = np.asarray(model.apply(store.load_version(v, like=model.init(model.key())), {name: x}))
    with live_server(*args) as live:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{live.port}")
        assert c.is_server_live() and c.is_server_ready()
        meta = c.get_server_metadata()
        assert meta["name"] == "treeguard" and "binary_tensor_data" in meta["extensions"]
        assert c.is_model_ready(which) and c.is_model_ready(which, v)
        assert not c.is_model_ready(which, "v999999") and not c.is_model_ready("other")
        mm = c.get_model_metadata(which, v)
        assert mm["versions"] == [v]
        assert mm["inputs"] == [
            {
                "name": name,
                "datatype": "FP32",
                "shape": [-1, *tail],
                "parameters": {"key_path": path},
            }
        ]
        assert [(o["name"], o["datatype"], o["shape"][0]) for o in mm["outputs"]] == [
            ("output", "FP32", -1)
        ]
        for binary in (False, True):
            inp = httpclient.InferInput(name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("output", binary_data=binary)
            for version in ("", v):
                r = c.infer(
                    which, [inp], model_version=version, outputs=[out], request_id=f"r{binary}"
                )
                got = r.as_numpy("output")
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
                resp = r.get_response()
                assert resp["id"] == f"r{binary}" and resp["model_version"] == v
        with pytest.raises(Exception, match="unknown output"):
            c.infer(which, [inp], outputs=[httpclient.InferRequestedOutput("nope")])
        c.close()


@pytest.mark.slow
def test_curl_reaches_every_route(tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("no curl")
    _, store, v = _store(tmp_path, "treeguard.examples.mlp")
    args = ["treeguard.examples.mlp:model", "--store", str(store.root), "--input", "['x']"]
    body = {
        "id": "c1",
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0.5, -0.5]}],
    }
    with live_server(*args) as live:

        def curl(route: str, *extra: str) -> tuple[int, str]:
            out = subprocess.run(
                ["curl", "-s", "-m", "20", "-w", "\n%{http_code}", *extra, live.url + route],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            text, _, code = out.stdout.rpartition("\n")
            return int(code), text

        assert curl("/v2")[0] == 200
        assert curl("/v2/health/live")[0] == 200
        assert curl("/v2/health/ready")[0] == 200
        assert curl("/v2/models/mlp/ready")[0] == 200
        assert curl(f"/v2/models/mlp/versions/{v}/ready")[0] == 200
        code, text = curl(f"/v2/models/mlp/versions/{v}")
        assert code == 200 and json.loads(text)["outputs"][0]["name"] == "output"
        for route in ("/v2/models/mlp/infer", f"/v2/models/mlp/versions/{v}/infer"):
            code, text = curl(route, "-H", "Content-Type: application/json", "-d", json.dumps(body))
            assert code == 200, text
            doc = json.loads(text)
            assert doc["id"] == "c1" and doc["outputs"][0]["shape"] == [1, 1]
            p = jax.tree.map(np.asarray, store.load_version(v))
            want = np.tanh(np.array([[0.5, -0.5]]) @ p["dense1"]["w"] + p["dense1"]["b"])
            want = want @ p["dense2"]["w"] + p["dense2"]["b"]
            np.testing.assert_allclose(doc["outputs"][0]["data"], want.ravel(), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["mlp", "eqx_mlp"])
def test_tritonclient_grpc_every_call(tmp_path, which):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    module, path, name, tail = MODELS[which]
    model, store, v = _store(tmp_path, module)
    args = [f"{module}:model", "--store", str(store.root), "--input", path]
    x = np.random.default_rng(1).uniform(-1, 1, (5, *tail)).astype(np.float32)
    want = np.asarray(model.apply(store.load_version(v, like=model.init(model.key())), {name: x}))
    with live_server(*args, grpc=True) as live:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{live.grpc_port}")
        served = treeguard.serving.ServingSpec.from_model(model).name
        assert c.is_server_live() and c.is_server_ready()
        assert c.is_model_ready(served) and c.is_model_ready(served, v)
        assert not c.is_model_ready(served, "v999999")
        meta = c.get_server_metadata()
        assert meta.name == "treeguard" and "binary_tensor_data" in meta.extensions
        mm = c.get_model_metadata(served)
        assert [(t.name, t.datatype, list(t.shape)) for t in mm.inputs] == [
            (name, "FP32", [-1, *tail])
        ]
        assert [(t.name, t.datatype, list(t.shape)) for t in mm.outputs] == [
            ("output", "FP32", [-1, 1])
        ]
        inp = grpcclient.InferInput(name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        r = c.infer(
            served, [inp], request_id="g1", outputs=[grpcclient.InferRequestedOutput("output")]
        )
        np.testing.assert_allclose(r.as_numpy("output"), want, rtol=1e-5, atol=1e-5)
        assert r.get_response().id == "g1" and r.get_response().model_version == v
        bad = grpcclient.InferInput(name, [5, tail[0] + 1], "FP32")
        bad.set_data_from_numpy(np.zeros((5, tail[0] + 1), np.float32))
        with pytest.raises(Exception, match="in the request, f32") as e:
            c.infer(served, [bad])
        assert "INVALID_ARGUMENT" in str(e.value)
        with pytest.raises(Exception, match="no model of that name"):
            c.infer("other", [inp])
        c.close()
