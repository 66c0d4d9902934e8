"""The release check from the command line: ``store verify --model`` runs the
model's checks before the verdict; a verdict without them says so, and
``serve`` refuses it unless ``--allow-unchecked``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from serving_support import mlp_params, tiny_spec

import treeguard
from treeguard._cli.main import main
from treeguard.serving import Server, ServingError


def _verify(root, version, *extra):
    return CliRunner().invoke(main, ["store", "verify", str(root), version, *extra])


@pytest.mark.parametrize("which", ["mlp", "eqx_mlp"])
def test_verify_with_the_model_runs_its_checks_and_ls_shows_them(tmp_path, which):
    import importlib

    model = importlib.import_module(f"treeguard.examples.{which}").model
    store = treeguard.ArtifactStore(tmp_path / "s")
    checked = store.put(model.init(model.key()))
    out = _verify(store.root, checked, "--model", f"treeguard.examples.{which}:model")
    assert out.exit_code == 0, out.output
    unchecked = store.put(model.init(model.key()))
    assert _verify(store.root, unchecked).exit_code == 0
    ls = json.loads(CliRunner().invoke(main, ["store", "ls", str(store.root), "--json"]).output)
    by = {v["version"]: v["checks"] for v in ls["versions"]}
    assert by == {
        checked: ["model.contract", "model.finite", "model.outputs"],
        unchecked: [],
    }
    table = CliRunner().invoke(main, ["store", "ls", str(store.root)]).output
    assert "contract, finite, outputs" in table and "[]" in table


def test_a_version_whose_outputs_are_nan_is_rejected_by_the_model_check(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    bad = mlp_params(0)
    # finite params, Inf outputs on any backend: every hidden unit is tanh(10) = 1,
    # so each output sums three products of 3e38 (on a TPU too, whose matmuls
    # round their inputs to bfloat16 and add in float32)
    bad["dense1"]["w"] = np.zeros((2, 3), np.float32)
    bad["dense1"]["b"] = np.full((3,), 10.0, np.float32)
    bad["dense2"]["w"] = np.full((3, 1), 3e38, np.float32)
    bad["dense2"]["b"] = np.full((1,), -3e38, np.float32)
    v = store.put(bad)
    out = _verify(store.root, v, "--model", "treeguard.examples.mlp:model")
    assert out.exit_code == 1, out.output
    assert "check model.outputs raised ValueError: output <root> is NaN or Inf on the case" in (
        " ".join(out.output.split())
    )
    assert store.info(v).status == "rejected"


def test_serve_refuses_an_unchecked_verdict_unless_allowed(tmp_path):
    import tinymodel

    store = treeguard.ArtifactStore(tmp_path / "s")
    v = store.put(tinymodel.params())
    store.verify(v)
    store.promote(v)
    strict = Server(tinymodel.model, store, spec=tiny_spec(), allow_unchecked=False)
    with pytest.raises(ServingError) as e:
        strict.start()
    assert str(e.value) == (
        f"no version can be served: {v}: version {v} was verified with no model check "
        "(checks: [])\nhint: verify and promote a version that passes the model's checks"
    )
    Server(tinymodel.model, store, spec=tiny_spec(), allow_unchecked=True).start()


@pytest.mark.slow
@pytest.mark.parametrize(("which", "path", "kind"), [("cnn", "['image']", "State"),
                                                     ("eqx_mlp", "['x']", "MLP")])  # fmt: skip
def test_framework_models_that_declare_a_params_spec_verify_and_serve(
    tmp_path, monkeypatch, which, path, kind
):
    import importlib

    import jax

    base = importlib.import_module(f"treeguard.examples.{which}").model
    params = base.init(base.key())
    treeguard.spec_of(params).save(tmp_path / "params.spec.json")
    (tmp_path / f"declared_{which}.py").write_text(
        "import dataclasses\n"
        f"from treeguard.examples.{which} import model as base\n"
        f"model = dataclasses.replace(base, params_spec={str(tmp_path / 'params.spec.json')!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module(f"declared_{which}").model
    store = treeguard.ArtifactStore(tmp_path / "s")
    v = store.put(params)
    out = _verify(store.root, v, "--model", f"declared_{which}:model")
    assert out.exit_code == 0, out.output
    store.promote(v)
    spec = treeguard.serving.ServingSpec.from_model(model, inputs=[path], buckets=(1, 4))
    server = Server(model, store, spec=spec)
    server.start()
    served = server.weights.active.params
    assert type(served).__name__ == kind  # loaded into the model's own structure
    leaf = spec.inputs.leaves[0]
    x = np.random.default_rng(0).uniform(0, 1, (3, *leaf.shape[1:])).astype(np.float32)
    outs, version = server.runner.run(server.weights.active, [x], 3)
    want = np.asarray(model.apply(params, jax.tree.unflatten(spec.inputs.treedef, [x])))
    assert version == v
    np.testing.assert_allclose(outs[0][1], want, rtol=1e-5, atol=1e-5)
