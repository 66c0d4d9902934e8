"""Helpers of the Ray Serve tests: stores of release-checked versions, the
expected outputs of each version, and a bounded load through the proxy."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest
from click.testing import CliRunner

import treeguard
from treeguard._cli.main import main

MODELS = {"mlp": "treeguard.examples.mlp", "eqx_mlp": "treeguard.examples.eqx_mlp"}


@dataclasses.dataclass
class Versions:
    """A store and its versions, with each version's params."""

    store: treeguard.ArtifactStore
    names: list[str]
    params: dict[str, Any]
    model: Any

    def expected(self, version: str, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.asarray(self.model.apply(self.params[version], {"x": x}))


def checked_store(folder: Path, which: str, seeds: tuple[int, ...] = (0, 1)) -> Versions:
    """A store of ``which`` with a version per seed, each verified with the
    model's release checks (``store verify --model``); the first is current."""
    module = MODELS[which]
    model = importlib.import_module(module).model
    store = treeguard.ArtifactStore.init(folder / f"{which}-store")
    names, params = [], {}
    for seed in seeds:
        tree = model.init(jax.random.key(seed))
        v = store.put(tree)
        out = CliRunner().invoke(
            main, ["store", "verify", str(store.root), v, "--model", f"{module}:model"]
        )
        assert out.exit_code == 0, out.output
        names.append(v)
        params[v] = tree
    store.promote(names[0])
    return Versions(store, names, params, model)


def body(x: np.ndarray[Any, Any], name: str = "x") -> dict[str, Any]:
    """A request of one FP32 input ``name`` (the bundled MLP's is ``x``)."""
    return {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }


@dataclasses.dataclass
class Outcome:
    status: int
    version: str | None
    ok: bool  # the outputs are the named version's on this input
    error: str = ""
    after: bool = False  # sent after the phase the load was told of


class Load:
    """``threads`` clients sending one request after another through the
    proxy until ``stop``; each response is checked against the version it
    names. Bounded: each client stops after ``max_requests``."""

    def __init__(
        self,
        url: str,
        model_name: str,
        versions: Versions,
        threads: int = 3,
        max_requests: int = 3000,
    ):
        self.url = f"http://{url}/v2/models/{model_name}/infer"
        self.versions = versions
        self.outcomes: list[Outcome] = []
        self.phase = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i, max_requests)) for i in range(threads)
        ]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def count(self, *, after: bool = False) -> int:
        with self._lock:
            return sum(1 for o in self.outcomes if o.after or not after)

    def _run(self, seed: int, max_requests: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(timeout=60) as client:
            for _ in range(max_requests):
                if self._stop.is_set():
                    return
                after = self.phase.is_set()
                x = rng.uniform(-1, 1, (int(rng.integers(1, 5)), 2)).astype(np.float32)
                try:
                    r = client.post(self.url, json=body(x))
                except httpx.HTTPError as e:
                    outcome = Outcome(0, None, False, type(e).__name__, after)
                else:
                    outcome = self._judge(r, x, after)
                with self._lock:
                    self.outcomes.append(outcome)

    def _judge(self, r: httpx.Response, x: np.ndarray[Any, Any], after: bool) -> Outcome:
        if r.status_code != 200:
            return Outcome(r.status_code, None, False, r.text[:300], after)
        doc = r.json()
        version = doc["model_version"]
        got = np.asarray(doc["outputs"][0]["data"], np.float32).reshape(doc["outputs"][0]["shape"])
        ok = version in self.versions.params and np.allclose(
            got, self.versions.expected(version, x), rtol=1e-5, atol=1e-5
        )
        return Outcome(200, version, bool(ok), "", after)


def wait_until(predicate: Any, deadline_s: float = 180.0) -> None:
    """Polls ``predicate`` until true; the deadline is a safety stop, never a verdict."""
    stop = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > stop:
            raise AssertionError("the condition never held")
        time.sleep(0.2)


def deploy(
    cluster: Any, versions: Versions, name: str, target: str, *, allow_unchecked: bool = False
) -> dict[str, int]:
    """Runs ``target`` as the application ``name`` (2 replicas), the only one on the proxy."""
    return cluster.call(  # type: ignore[no-any-return]
        "deploy",
        target=target,
        store=str(versions.store.root),
        name=name,
        replicas=2,
        inputs=["['x']"],
        allow_unchecked=allow_unchecked,
    )


def controller_log(cluster: Any) -> str:
    """What Ray Serve's controller logged (each failed health check, with its error)."""
    logs = sorted(Path(cluster.ray_dir).glob("session_latest/logs/serve/controller_*.log"))
    return "\n".join(log.read_text(errors="replace") for log in logs)


def served_requests(metrics_text: str) -> float:
    """The 200 responses a replica's metrics count."""
    found = re.findall(
        r'^treeguard_requests_total\{model="mlp",status="200"\} (\S+)$', metrics_text, re.M
    )
    return sum(float(v) for v in found)


def infer_with_tritonclient(url: str, versions: Versions, version: str) -> None:
    """tritonclient.http against ``url``: readiness, then one request with
    JSON and one with binary tensors, each answered by ``version``'s params."""
    httpclient = pytest.importorskip("tritonclient.http")
    c = httpclient.InferenceServerClient(url)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("mlp") and c.is_model_ready("mlp", version)
    meta = c.get_model_metadata("mlp")
    assert [i["name"] for i in meta["inputs"]] == ["x"] and meta["outputs"][0]["name"] == "output"
    x = np.random.default_rng(3).uniform(-1, 1, (3, 2)).astype(np.float32)
    for binary in (False, True):
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("output", binary_data=binary)
        result = c.infer("mlp", [inp], outputs=[out], request_id="r-7")
        np.testing.assert_allclose(
            result.as_numpy("output"), versions.expected(version, x), rtol=1e-5, atol=1e-6
        )
        assert result.get_response()["model_version"] == version
        assert result.get_response()["id"] == "r-7"


def kill_one_under_load(
    cluster: Any,
    versions: Versions,
    name: str,
    routed: Callable[[str], bool] | None = None,
) -> tuple[Load, str, str]:
    """SIGKILLs one replica of ``name`` while a ``Load`` runs, waits until Ray
    has replaced it (and ``routed(new replica id)`` holds) and the new replica
    has served 5 requests. Returns the load, the killed replica's id and the
    new replica's metrics text."""
    live = cluster.call("replicas", name=name)
    victim_id, victim = sorted(live.items())[0]
    with Load(cluster.url, "mlp", versions) as load:
        wait_until(lambda: load.count() >= 20)
        os.kill(victim, signal.SIGKILL)
        now = cluster.call("wait_replicas", name=name, n=2, not_pids=[victim])
        assert "error" not in now, now
        (fresh,) = set(now) - set(live)
        if routed is not None:
            wait_until(lambda: routed(fresh))
        url = cluster.call("metrics", name=name)[fresh]
        load.phase.set()
        wait_until(lambda: served_requests(cluster.fetch(url)) >= 5)
    return load, victim_id, cluster.fetch(url)
