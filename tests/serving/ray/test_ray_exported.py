"""``treeguard serve --store S --ray`` with no MODULE:ATTR: Ray replicas of the
exported artifact, its module nowhere on the replicas' path, and
``treeguard serve swap --ray`` checking each version's artifact as it checks
its params (a tampered artifact and a version without one are refused,
naming the version asked for and the one served)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest
from click.testing import CliRunner
from fleet import body

import treeguard
from treeguard._cli.main import main

# the user's own models of the export tests, imported here only (to export them)
sys.path.insert(0, str(Path(__file__).parents[2] / "export"))
import usermodels

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # the session's cluster

#: The server's process: the user's module must not be importable there.
SERVER = (
    "import importlib.util, sys\n"
    "assert importlib.util.find_spec('usermodels') is None\n"
    "from treeguard._cli.main import main\n"
    "sys.argv = ['treeguard', *sys.argv[1:]]\n"
    "main()\n"
)
TARGET = "usermodels:eqx_model"
#: How the server's first line goes on: with no token file named (no
#: ``RAY_AUTH_TOKEN_PATH``), the swap command it prints names none.
PRINTED = "with 2 replicas; swap them with: RAY_AUTH_MODE=token treeguard serve swap --ray VERSION "


def _cli(*args: str) -> str:
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, out.output
    return out.output


def _version(
    store: treeguard.ArtifactStore, params: dict[str, Any], seed: int, *, export: bool = True
) -> str:
    """A version of the eqx model's params from ``seed`` (kept in ``params``):
    exported (or not), then verified with the model's release checks."""
    tree = usermodels.eqx_model.init(jax.random.key(seed))
    v = store.put(tree)
    if export:
        _cli("export", TARGET, "--store", str(store.root), v)
    _cli("store", "verify", str(store.root), v, "--model", TARGET)
    params[v] = tree
    return v


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", SERVER, *args], capture_output=True, env=env, cwd=cwd, timeout=300
    )


def _token_mode() -> dict[str, str]:
    """This environment with Ray's token authentication (on by default for a
    cluster Ray starts) and its default token file (no ``RAY_AUTH_TOKEN_PATH``)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"}
    return env | {"RAY_AUTH_MODE": "token"}


def test_replicas_serve_the_artifact_and_swaps_check_each_version_s_artifact(cluster, tmp_path):
    model = usermodels.eqx_model
    store = treeguard.ArtifactStore.init(tmp_path / "store")
    params: dict[str, Any] = {}
    v1, v2, tampered = (_version(store, params, seed) for seed in (0, 1, 2))
    bare = _version(store, params, 3, export=False)
    store.promote(v1)
    blob = tmp_path / "store" / "versions" / tampered / "exported.bin"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    cluster.call("clear")
    assert cluster.call("importable", module="usermodels") is False
    address = cluster.call("address")
    env = _token_mode()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ray_args = ["--ray-address", address, "--ray-app", "exported"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, "serve", "--store", str(store.root), "--ray", *ray_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=elsewhere,
        start_new_session=True,
    )
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    x = np.random.default_rng(3).uniform(-1, 1, (3, usermodels.IN)).astype(np.float32)
    url = f"http://{cluster.url}/v2/models/{model.name}/infer"
    request = body(x, "features")

    def answer(version: str) -> None:
        doc = httpx.post(url, json=request, timeout=60).json()
        assert doc["model_version"] == version, doc
        out = doc["outputs"][0]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        want = np.asarray(model.apply(params[version], {"features": x}))
        np.testing.assert_allclose(got, want, rtol=model.rtol, atol=model.atol)

    try:
        first = lines.get(timeout=300).decode()  # a safety stop
        assert first.startswith(f"serving 'exported' on http://{cluster.url} {PRINTED}")
        answer(v1)
        swap = ["serve", "swap", "--ray", v2, *ray_args]
        done = _run(swap, env, elsewhere)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert done.stdout.decode().strip() == f"serving {v2} on 2 replicas"
        answer(v2)
        for version, why in ((tampered, "does not match its digest"), (bare, "holds no exported")):
            done = _run(["serve", "swap", "--ray", version, *ray_args], env, elsewhere)
            err = done.stderr.decode()
            assert done.returncode == 1, err[-2000:]
            assert f"swap to {version} refused" in err and f"none switched from {v2}" in err, err
            assert f"cannot replace the exported function served (version {v1}'s)" in err, err
            assert why in err, err
        answer(v2)
        assert store.current() == v2
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        proc.stdout.close()
    assert proc.returncode == 0
