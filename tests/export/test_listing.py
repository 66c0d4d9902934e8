"""``treeguard store ls`` (and ``--json``) says what each version holds of an
exported artifact: the platforms and jax of one a server would take, else
why a server would not."""

from __future__ import annotations

import json

import jax
import pytest
from click.testing import CliRunner

import treeguard
from treeguard._cli.main import main
from treeguard.examples import mlp
from treeguard.export import export_version


@pytest.mark.slow  # five versions, four exports (the listing's doctest runs by default)
def test_store_ls_shows_each_version_s_artifact_as_the_server_s_gate_sees_it(tmp_path):
    store = treeguard.ArtifactStore.init(tmp_path / "s")
    servable, uncovered, unverified, changed, plain = (
        store.put(mlp.init(jax.random.key(seed))) for seed in range(5)
    )
    for v in (servable, changed):
        export_version(mlp.model, store, v)
        assert store.verify(v).status == "verified"
    assert store.verify(uncovered).status == "verified"
    export_version(mlp.model, store, uncovered)  # after its verdict
    export_version(mlp.model, store, unverified)
    assert store.verify(plain).status == "verified"
    blob = tmp_path / "s" / "versions" / changed / "exported.bin"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    runner = CliRunner()
    out = runner.invoke(main, ["store", "ls", str(store.root), "--json"])
    assert out.exit_code == 0, out.output
    listed = {v["version"]: v["exported"] for v in json.loads(out.output)["versions"]}
    assert listed == {
        servable: {"state": "servable", "platforms": ["cpu"], "jax": jax.__version__},
        uncovered: {"state": "uncovered", "platforms": None, "jax": None},
        unverified: {"state": "unverified", "platforms": None, "jax": None},
        changed: {"state": "changed", "platforms": None, "jax": None},
        plain: None,
    }
    out = runner.invoke(main, ["store", "ls", str(store.root)], terminal_width=200)
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: line for line in out.output.splitlines()[1:] if line.split()}
    assert "exported" in rows["version"]
    assert f"cpu (jax {jax.__version__})" in rows[servable]
    for v, cell in ((uncovered, "uncovered"), (unverified, "unverified"), (changed, "changed")):
        assert cell in rows[v].split(), rows[v]
