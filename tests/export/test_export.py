"""Exported artifacts: stored only when they match the live model, covered by
the version's (signed) verdict, refused when missing, changed, uncovered or
written for another jax or platform, at start and at swap."""

from __future__ import annotations

import importlib
import json

import blake3
import jax
import numpy as np
import pytest
import usermodels
from click.testing import CliRunner

import treeguard
from treeguard._cli.main import main
from treeguard.export import export_version, served_from_store
from treeguard.serving import Server, ServingError, ServingSpec, verify_version


def _exported(store, model, *, promote=True, seed=0):
    params = model.init(jax.random.key(seed))
    v = store.put(params)
    export_version(model, store, v)
    assert verify_version(store, v, model).status == ("verified")
    if promote:
        store.promote(v)
    return v, params


def _outputs(server, rows):
    leaves = [np.asarray(x) for x in rows]
    out, _ = server.runner.run(server.weights.active, leaves, int(leaves[0].shape[0]))
    return dict(out)


def _live(model, params, spec, rows):
    batch = spec.inputs.treedef.unflatten([np.asarray(x) for x in rows])
    out = jax.jit(model.apply)(params, batch)
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree.leaves_with_path(out)}


@pytest.mark.parametrize(
    "module",
    [
        "treeguard.examples.mlp",
        pytest.param("treeguard.examples.cnn", marks=pytest.mark.slow),
        pytest.param("treeguard.examples.eqx_mlp", marks=pytest.mark.slow),
    ],
)
def test_each_bundled_model_is_exported_and_served_from_its_artifact(tmp_path, module):
    model = importlib.import_module(module).model
    store = treeguard.ArtifactStore(tmp_path / "s")
    v, params = _exported(store, model)
    served = served_from_store(store)
    assert served.version == v and served.model is not model
    server = Server(served.model, store, spec=served.spec, version_check=served.check)
    server.start()
    rng = np.random.default_rng(0)
    rows = [
        rng.uniform(-1, 1, (3, *(int(d) for d in leaf.shape[1:]))).astype(leaf.dtype)
        for leaf in served.spec.inputs.leaves
    ]
    got, want = _outputs(server, rows), _live(model, params, served.spec, rows)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=model.rtol, atol=model.atol)


@pytest.mark.slow
def test_a_function_without_a_symbolic_batch_axis_is_exported_per_bucket(tmp_path):
    m = usermodels.branching_model
    store = treeguard.ArtifactStore(tmp_path / "s")
    params = m.init(m.key())
    v = store.put(params)
    spec = ServingSpec.from_model(m, buckets=(1, 4))
    result = export_version(m, store, v, spec=spec)
    assert result.description.batches == (1, 4)
    assert result.description.validated == ("standard", "single", "zeros", "boundary")
    assert verify_version(store, v, m).status == "verified"
    store.promote(v)
    served = served_from_store(store)
    server = Server(served.model, store, spec=served.spec, version_check=served.check)
    server.start()
    x = np.random.default_rng(1).uniform(-1, 1, (3, usermodels.IN)).astype(np.float32)
    got = _outputs(server, [x])  # 3 rows: run in bucket 4, padding sliced off
    want = _live(m, params, served.spec, [x])
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=m.rtol, atol=m.atol)


def test_a_host_callback_is_refused_at_export_and_nothing_is_stored(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    m = usermodels.callback_model
    v = store.put(m.init(m.key()))
    with pytest.raises(treeguard.ExportError, match="calls back into Python") as e:
        export_version(m, store, v)
    assert e.value.exit_code == 2
    assert not (tmp_path / "s" / "versions" / v / "exported.json").exists()
    assert not (tmp_path / "s" / "versions" / v / "exported.bin").exists()


def test_an_export_unlike_the_live_model_stores_nothing(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    m = usermodels.drifting_model
    v = store.put(m.init(m.key()))
    with pytest.raises(treeguard.ExportValidationError, match="differs from the live model's") as e:
        export_version(m, store, v)
    assert e.value.case and f"on the case {e.value.case!r}" in str(e.value)
    assert e.value.exit_code == 1
    assert sorted(p.name for p in (tmp_path / "s" / "versions" / v).iterdir()) == [
        "model.safetensors",
        "status.json",
    ]


def test_the_verdict_covers_the_artifact_and_a_changed_artifact_is_refused(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    v, _ = _exported(store, usermodels.eqx_model)
    vdir = tmp_path / "s" / "versions" / v
    record = json.loads((vdir / "status.json").read_text())
    assert record["exported"] == blake3.blake3((vdir / "exported.json").read_bytes()).hexdigest()
    blob = bytearray((vdir / "exported.bin").read_bytes())
    blob[len(blob) // 2] ^= 1
    (vdir / "exported.bin").write_bytes(bytes(blob))
    with pytest.raises(treeguard.ArtifactError, match="does not match its digest") as e:
        served_from_store(store)
    assert e.value.field == "digest" and e.value.version == v


def test_a_description_edited_with_its_digest_recomputed_fails_the_signature(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s", key=b"k" * 32)
    v, _ = _exported(store, usermodels.eqx_model)
    vdir = tmp_path / "s" / "versions" / v
    meta = json.loads((vdir / "exported.json").read_text())
    meta["platforms"] = ["cpu", "tpu"]
    text = (json.dumps(meta, sort_keys=True, separators=(",", ":")) + "\n").encode()
    (vdir / "exported.json").write_bytes(text)
    record = json.loads((vdir / "status.json").read_text())
    record["exported"] = blake3.blake3(text).hexdigest()
    (vdir / "status.json").write_text(json.dumps(record))
    with pytest.raises(treeguard.SignatureError):
        served_from_store(store)


@pytest.mark.slow
def test_an_ec_signed_verdict_covers_the_artifact_for_a_host_with_public_keys_only(tmp_path):
    from treeguard.provenance import generate_keys

    key, pub = generate_keys(tmp_path / "ci")
    root = tmp_path / "s"
    ci = treeguard.ArtifactStore(root, signing_key=key)
    v, _ = _exported(ci, usermodels.eqx_model)
    host = treeguard.ArtifactStore(root, trusted_keys=[pub])
    assert served_from_store(host).version == v
    # a writer of the store without the key swaps the artifact and every digest
    vdir = root / "versions" / v
    meta = json.loads((vdir / "exported.json").read_text())
    meta["rtol"] = 0.5
    text = (json.dumps(meta, sort_keys=True, separators=(",", ":")) + "\n").encode()
    (vdir / "exported.json").write_bytes(text)
    record = json.loads((vdir / "status.json").read_text())
    record["exported"] = blake3.blake3(text).hexdigest()
    (vdir / "status.json").write_text(json.dumps(record))
    with pytest.raises(treeguard.SignatureError, match="signature does not verify"):
        served_from_store(host)


def test_an_artifact_exported_after_the_verdict_or_missing_is_refused(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    m = usermodels.eqx_model
    v = store.put(m.init(m.key()))
    verify_version(store, v, m)
    store.promote(v)
    with pytest.raises(treeguard.ArtifactError, match="holds no exported artifact") as e:
        served_from_store(store)
    assert e.value.field == "missing"
    export_version(m, store, v)
    with pytest.raises(treeguard.ArtifactError, match="does not cover") as e:
        served_from_store(store)
    assert e.value.field == "verdict"
    with pytest.raises(treeguard.StoreError, match="already holds an exported artifact"):
        export_version(m, store, v)


@pytest.fixture(scope="module")
def exported_mlp(tmp_path_factory):
    """One export's bytes and description, attached again below with edits."""
    store = treeguard.ArtifactStore(tmp_path_factory.mktemp("exported") / "s")
    v, _ = _exported(store, usermodels.eqx_model)
    return store.load_exported(v)


def _served_with(tmp_path, exported, **changes):
    """``served_from_store`` on a store whose current version's artifact
    describes itself with ``changes`` (attached, verified and signed as any)."""
    meta, blob = exported
    store = treeguard.ArtifactStore(tmp_path / "s")
    m = usermodels.eqx_model
    v = store.put(m.init(m.key()))
    store.attach_exported(v, blob, {**meta, **changes})
    assert verify_version(store, v, m).status == "verified"
    store.promote(v)
    return served_from_store(store)


def test_another_jax_window_or_platform_is_refused_naming_both_sides(tmp_path, exported_mlp):
    with pytest.raises(treeguard.ArtifactError) as e:
        _served_with(tmp_path / "jax", exported_mlp, jax="0.4.1", calling_convention=1)
    assert e.value.field == "jax"
    assert "jax 0.4.1" in str(e.value) and f"jax {jax.__version__} here" in str(e.value)
    here = jax.default_backend()
    other = "tpu" if here == "cpu" else "cpu"
    with pytest.raises(treeguard.ArtifactError) as e:
        _served_with(tmp_path / "other", exported_mlp, platforms=[other])
    assert e.value.field == "platform"
    assert f"exported for {other}" in str(e.value) and f"runs on {here}" in str(e.value)


@pytest.mark.slow
def test_a_swap_checks_the_artifact_of_the_version_it_goes_to(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    m = usermodels.eqx_model
    v1, _ = _exported(store, m)
    v2, _ = _exported(store, m, promote=False, seed=1)
    served = served_from_store(store)
    server = Server(served.model, store, spec=served.spec, version_check=served.check)
    server.start()
    assert server.weights.swap(v2)["active"] == v2  # the same function, other params
    blob = tmp_path / "s" / "versions" / v1 / "exported.bin"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(ServingError, match="does not match its digest"):
        server.weights.swap(v1)  # held and warm, and still checked again
    assert server.status()["active"] == v2
    # the same params' structure, exported from changed code: another function
    v3, _ = _exported(store, usermodels.eqx_relu_model, promote=False, seed=2)
    with pytest.raises(ServingError, match="exported function is not the one served"):
        server.weights.swap(v3)
    assert server.status()["active"] == v2
    # a verified version without an artifact: refused, naming it and the served one's
    bare = store.put(m.init(jax.random.key(3)))
    assert verify_version(store, bare, m).status == "verified"
    with pytest.raises(ServingError) as e:
        server.weights.swap(bare)
    assert f"version {bare} holds no exported artifact" in str(e.value)
    assert f"cannot replace the exported function served (version {v1}'s)" in str(e.value)
    assert server.status()["active"] == v2


def test_the_cli_exports_and_refuses_a_callback_with_exit_2(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    m = usermodels.callback_model
    v = store.put(m.init(m.key()))
    out = CliRunner().invoke(
        main, ["export", "usermodels:callback_model", "--store", str(store.root), v]
    )
    assert out.exit_code == 2, out.output
    assert "calls back into Python" in out.output
    v2 = store.put(usermodels.eqx_model.init(usermodels.eqx_model.key()))
    out = CliRunner().invoke(
        main, ["export", "usermodels:eqx_model", "--store", str(store.root), v2]
    )
    assert out.exit_code == 0, out.output
    assert "checked on 4 cases" in out.output


def test_serving_an_artifact_refuses_inputs_before_reading_it(tmp_path):
    store = treeguard.ArtifactStore.init(tmp_path / "s")
    out = CliRunner().invoke(main, ["serve", "--store", str(store.root), "--input", "['x']"])
    assert out.exit_code == 2, out.output
    assert "an exported artifact is served without --input" in out.output


@pytest.mark.parametrize("extra", [[], ["--ray"]])
def test_serving_a_store_without_a_current_version_says_so(tmp_path, extra):
    # with --ray, the artifact's gates run before any replica (or Ray) starts
    store = treeguard.ArtifactStore.init(tmp_path / "s")
    out = CliRunner().invoke(main, ["serve", "--store", str(store.root), *extra])
    assert out.exit_code == 1, out.output
    assert "has no current version" in out.output


def test_serve_takes_the_store_s_keys_as_options(tmp_path):
    from treeguard.examples import mlp
    from treeguard.provenance import PublicKey, generate_keys

    key, pub = generate_keys(tmp_path / "ci")
    root = tmp_path / "s"
    _exported(treeguard.ArtifactStore(root, signing_key=key), mlp.model)
    fingerprint = PublicKey.load(pub).fingerprint
    # a host that holds the release key's public half, revoked: nothing is served
    out = CliRunner().invoke(
        main, ["serve", "--store", str(root), "--trusted-key", pub, "--revoked-key", pub]
    )
    assert out.exit_code == 1, out.output
    assert fingerprint in out.output
    # the options are not carried to Ray's replicas: said before anything starts
    out = CliRunner().invoke(
        main,
        [
            "serve",
            "treeguard.examples.mlp:model",
            "--store",
            str(root),
            "--ray",
            "--trusted-key",
            str(pub),
        ],
    )
    assert out.exit_code == 2, out.output
    assert "are not passed to Ray replicas" in out.output
