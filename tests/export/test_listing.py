"""``treeguard store ls`` (and ``--json``) says what each version holds of an
exported artifact: the platforms and jax of one its verdict covers, else why
a server would not take it. The listing reads descriptions, never an
artifact's bytes: their hash is the server's gate's."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest
from click.testing import CliRunner

import treeguard
from treeguard._cli.main import main
from treeguard.examples import mlp
from treeguard.export import export_version

# one worker runs the file: its module fixture (a real export) is made once, not once in each worker
pytestmark = pytest.mark.xdist_group("export_listing")


def _ls_json(root: str, *args: str) -> dict[str, dict | None]:
    out = CliRunner().invoke(main, ["store", "ls", root, "--json", *args])
    assert out.exit_code == 0, out.output
    return {v["version"]: v["exported"] for v in json.loads(out.output)["versions"]}


def _state(state: str) -> dict:
    return {"state": state, "platforms": None, "jax": None}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """One real export's bytes and description, attached again to other versions."""
    store = treeguard.ArtifactStore.init(tmp_path_factory.mktemp("one") / "s")
    v = store.put(mlp.init(jax.random.key(0)))
    export_version(mlp.model, store, v)
    assert store.verify(v).status == "verified"
    return store.load_exported(v)


def test_store_ls_says_each_version_s_artifact_state(tmp_path, artifact):
    meta, blob = artifact
    store = treeguard.ArtifactStore.init(tmp_path / "s")
    covered, uncovered, unverified, changed, cut, gone, dropped, newer, plain = (
        store.put(mlp.init(jax.random.key(seed))) for seed in range(9)
    )
    newer_meta = {**meta, "format": "treeguard.exported/2"}
    for v in (covered, unverified, changed, cut, gone, dropped, newer):
        store.attach_exported(v, blob, newer_meta if v == newer else meta)
    for v in (covered, uncovered, changed, cut, gone, dropped, newer, plain):
        assert store.verify(v).status == "verified"
    store.attach_exported(uncovered, blob, meta)  # after its verdict
    versions = Path(store.root, "versions")
    described = versions / changed / "exported.json"
    described.write_text(described.read_text().replace('"model"', '"model" ', 1))
    (versions / cut / "exported.bin").write_bytes(blob[:-1])  # a size unlike the described
    (versions / gone / "exported.bin").unlink()
    (versions / dropped / "exported.json").unlink()  # the verdict still covers it
    assert _ls_json(store.root) == {
        covered: {"state": "covered", "platforms": [jax.default_backend()], "jax": jax.__version__},
        uncovered: _state("uncovered"),
        unverified: _state("unverified"),
        changed: _state("changed"),
        cut: _state("changed"),
        gone: _state("missing"),
        dropped: _state("missing"),
        newer: _state("unreadable"),
        plain: None,
    }
    out = CliRunner().invoke(main, ["store", "ls", store.root], terminal_width=200)
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: line for line in out.output.splitlines()[1:] if line.split()}
    assert "exported" in rows["version"]
    assert f"{jax.default_backend()} (jax {jax.__version__})" in rows[covered]
    for v, cell in ((uncovered, "uncovered"), (unverified, "unverified"), (gone, "missing")):
        assert cell in rows[v].split(), rows[v]


def test_store_ls_hashes_no_artifact_byte_and_the_server_s_gate_does(tmp_path, artifact):
    meta, blob = artifact
    store = treeguard.ArtifactStore.init(tmp_path / "s")
    v = store.put(mlp.init(jax.random.key(0)))
    store.attach_exported(v, blob, meta)
    assert store.verify(v).status == "verified"
    path = Path(store.root, "versions", v, "exported.bin")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert _ls_json(store.root)[v]["state"] == "covered"  # the same size: the listing cannot tell
    with pytest.raises(treeguard.ArtifactError, match="does not match its digest") as e:
        store.load_exported(v)
    assert e.value.field == "digest"


def test_store_ls_says_refused_for_a_verdict_the_key_does_not_vouch_for(
    tmp_path, artifact, monkeypatch
):
    meta, blob = artifact
    key = tmp_path / "key"
    key.write_bytes(b"a key of sixteen bytes or more")
    store = treeguard.ArtifactStore.init(tmp_path / "s")
    v = store.put(mlp.init(jax.random.key(0)))
    store.attach_exported(v, blob, meta)
    assert store.verify(v).status == "verified"  # signed by no key
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", str(key))
    assert _ls_json(store.root) == {v: _state("refused")}
