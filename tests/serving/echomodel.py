"""A model whose outputs are its inputs, for any inputs: what a server decoded
from a request is what it answers, so decoding is tested through the public
``Server`` (its ``infer`` and its REST app) rather than through its decoder.

It runs under ``jax.enable_x64`` so that 64-bit inputs reach the model whole,
on the CPU backend whatever the default one is (a TPU's float64 is not IEEE
binary64: 1e300 does not come back), and with no batching delay, so that
each batch runs on the event loop's thread, where those settings hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np

import treeguard
from treeguard import LeafSpec, spec_of
from treeguard.serving import InferRequest, Limits, Server, ServingSpec
from treeguard.verify import Model

URL = "/v2/models/echo/infer"


def _apply(p: Any, batch: Any) -> dict[str, Any]:
    return {k: jnp.where(p["on"], x, x) for k, x in batch.items()}


def _params(key: Any = None) -> dict[str, np.ndarray[Any, Any]]:
    return {"on": np.asarray(True)}


@contextlib.contextmanager
def _exact() -> Any:
    """64-bit values, on the CPU backend."""
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        yield


def echo_server(
    root: Path, inputs: dict[str, LeafSpec], buckets: tuple[int, ...], **limits: Any
) -> Server:
    """A server of the echo model of ``inputs`` (a store of its one version under ``root``)."""
    batch = spec_of(inputs)
    model = Model(
        init=_params,
        apply=_apply,
        loss=lambda p, b: jnp.zeros(()),
        batch_spec=batch,
        rtol=0.0,
        atol=0.0,
        name="echo",
    )
    store = treeguard.ArtifactStore(root)
    v = store.put(_params())
    assert store.verify(v).status == "verified"
    store.promote(v)
    limits = {"max_delay_ms": 0.0, **limits}
    spec = ServingSpec(inputs=batch, buckets=buckets, name="echo", limits=Limits(**limits))
    with _exact():
        server = Server(model, store, spec=spec)
        server.start()
    return server


Decode = Callable[[InferRequest], Awaitable[list[np.ndarray[Any, Any]]]]


@contextlib.asynccontextmanager
async def decoding(server: Server) -> AsyncIterator[Decode]:
    """``decode(request)``: the arrays ``server`` makes of a parsed request, in
    its spec's order (an ``InvalidRequestError`` for one it refuses)."""
    names = [p.strip("[']") for p in server.spec.input_paths]

    async def decode(request: InferRequest) -> list[np.ndarray[Any, Any]]:
        result = await server.infer(request, "echo")
        arrays = {o.name: o.array for o in result.outputs}
        return [arrays[n] for n in names]

    with _exact():
        async with server.running():
            yield decode


@contextlib.asynccontextmanager
async def posting(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``server``'s REST app, in process."""
    app = server.app()
    with _exact():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                yield c
