"""Every command that names a store takes a bucket URL: `treeguard import`,
`treeguard store verify --model` and `treeguard serve --store`, against a
real SeaweedFS S3 server."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest
from click.testing import CliRunner, Result
from ports import free_port

from tests.subproc import child_env, start_python, stop
from treeguard import ArtifactStore, load
from treeguard._cli.main import main
from treeguard.examples import mlp

# Every test here talks to the session's SeaweedFS server: the slow run starts
# it, on the one worker that runs the group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

CHESS = Path(__file__).parents[1] / "data" / "chess_cv_pieces.safetensors"


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_import_puts_foreign_weights_into_a_bucket_store_as_a_candidate(
    s3_url: str, tmp_path: Path
) -> None:
    done = _cli("import", str(CHESS), s3_url)
    assert done.exit_code == 2, done.output  # not a store yet: nothing read, nothing made
    assert "not a store" in done.output
    ArtifactStore.init(s3_url)
    done = _cli("import", str(CHESS), s3_url)
    assert done.exit_code == 0, done.output
    assert f"{s3_url} version v000001 (a candidate)" in " ".join(done.output.split())
    store = ArtifactStore(s3_url)
    info = store.info("v000001")
    assert info.status == "candidate"
    assert info.metadata["imported_from"]["format"] == "safetensors"
    assert store.verify("v000001").status == "verified"
    local = tmp_path / "chess.safetensors"  # the same import, to a file
    assert _cli("import", str(CHESS), str(local)).exit_code == 0
    want, got = load(local), store.load_version("v000001")
    assert jax.tree.structure(want) == jax.tree.structure(got)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))


def test_store_verify_with_the_model_checks_on_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v = store.put(mlp.init(jax.random.key(0)))
    done = _cli("store", "verify", s3_url, v, "--model", "treeguard.examples.mlp:model")
    assert done.exit_code == 0, done.output
    listed = json.loads(_cli("store", "ls", s3_url, "--json").output)
    (row,) = listed["versions"]
    assert row["status"] == "verified" and row["checks"], row


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_serve_from_a_store_in_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v = store.put(mlp.init(jax.random.key(0)))
    assert (
        _cli("store", "verify", s3_url, v, "--model", "treeguard.examples.mlp:model").exit_code == 0
    )
    store.promote(v)
    port = free_port()
    code = "import sys; from treeguard._cli.main import main; main(sys.argv[1:])"
    args = ["serve", "run", "treeguard.examples.mlp:model", "--store", s3_url, "--port", str(port)]
    proc = start_python(code, *args, env=child_env())
    base = f"http://127.0.0.1:{port}"
    try:
        ready = 0
        for _ in range(240):  # bounded: 240 polls of at most 0.5 s each
            if proc.poll() is not None:
                break
            try:
                ready = _get(f"{base}/v2/health/ready")[0]
            except OSError:
                ready = 0
            if ready == 200:
                break
            time.sleep(0.5)
        assert ready == 200, stop(proc, timeout=5)
        status, body = _get(f"{base}/v2")
        assert status == 200 and json.loads(body)
    finally:
        proc.kill()
        stop(proc)
