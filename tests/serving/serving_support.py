"""Helpers for the server tests (fixtures are re-exported by conftest.py): stores of the bundled model's versions, a
tiny model whose outputs can be made NaN, and an in-process client."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest

import treeguard
from treeguard.examples import mlp
from treeguard.serving import Limits, Server, ServingSpec

sys.path.insert(0, str(Path(__file__).parent))

import tinymodel


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def mlp_params(seed: int) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Params of the bundled model's contract, from numpy (no compile)."""
    rng = np.random.default_rng(seed)

    def f(*shape: int) -> np.ndarray[Any, Any]:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    return {"dense1": {"w": f(2, 3), "b": f(3)}, "dense2": {"w": f(3, 1), "b": f(1)}}


def put_verified(store: treeguard.ArtifactStore, params: Any) -> str:
    v = store.put(params)
    assert store.verify(v).status == "verified"
    return v


@pytest.fixture(scope="session")
def mlp_store(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[treeguard.ArtifactStore, dict[str, str]]:
    """A store of the bundled model: v1 current, v2 verified (same spec),
    a candidate, a rejected one and a tampered one."""
    store = treeguard.ArtifactStore(tmp_path_factory.mktemp("mlp") / "store")
    names = {}
    names["v1"] = put_verified(store, mlp_params(0))
    store.promote(names["v1"])
    names["v2"] = put_verified(store, mlp_params(1))
    names["candidate"] = store.put(mlp_params(2))
    rejected = store.put(mlp_params(3))
    store.verify(rejected, checks=[("never", lambda tree: False)])
    names["rejected"] = rejected
    tampered = put_verified(store, mlp_params(4))
    path = Path(store.info(tampered).path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    names["tampered"] = tampered
    return store, names


@pytest.fixture(scope="session")
def mlp_server(mlp_store: tuple[treeguard.ArtifactStore, dict[str, str]]) -> Server:
    """One warmed server of v1, shared by the tests that do not swap."""
    spec = mlp_spec(limits=Limits(max_request_bytes=64 * 1024, max_delay_ms=20))
    server = Server(mlp.model, mlp_store[0], spec=spec)
    server.start()
    return server


def mlp_spec(**options: Any) -> ServingSpec:
    options.setdefault("buckets", (1, 4, 16))
    return ServingSpec.from_model(mlp.model, inputs=["['x']"], name="mlp", **options)


@pytest.fixture
def tiny_store(tmp_path: Path) -> tuple[treeguard.ArtifactStore, dict[str, str]]:
    """A store of the tiny model: ``good`` current, ``nan`` verified (its
    params are finite, its outputs NaN on traffic)."""
    store = treeguard.ArtifactStore(tmp_path / "tiny")
    good = put_verified(store, tinymodel.params(eps=1.0))
    store.promote(good)
    nan = put_verified(store, tinymodel.params(eps=-1.0))
    return store, {"good": good, "nan": nan}


def tiny_spec(**options: Any) -> ServingSpec:
    options.setdefault("buckets", (1, 4))
    return ServingSpec.from_model(tinymodel.model, name="tiny", **options)


@contextlib.asynccontextmanager
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    """The server's app in process (warmed first), with its batcher running."""
    if not server.weights.ready:
        server.start()
    app = server.app()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c


def request(rows: int, value: float = 0.5, name: str = "x", cols: int = 2) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": name,
                "shape": [rows, cols],
                "datatype": "FP32",
                "data": [value] * (rows * cols),
            }
        ]
    }


def rows_of(rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
    return rng.uniform(-1, 1, (n, 2)).astype(np.float32)


def infer_body(x: np.ndarray[Any, Any], name: str = "x") -> dict[str, Any]:
    return {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }


Factory = Callable[..., Server]


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from the Prometheus text, 0 if it is absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def mlp_reference(params: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The bundled model's forward pass in numpy (no compile per shape)."""
    p = jax.tree.map(np.asarray, params)
    h = np.tanh(x @ p["dense1"]["w"] + p["dense1"]["b"])
    out: np.ndarray[Any, Any] = h @ p["dense2"]["w"] + p["dense2"]["b"]
    return out
