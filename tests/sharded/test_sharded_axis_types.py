"""Checkpoints on meshes of every axis type (Explicit, Auto, mixed), on 8 CPU
devices in process: ``save``/``load(like=)`` onto shardings,
``save_sharded``/``load_sharded`` (also onto another axis type), and the
store's sharded versions, bit for bit with the shardings of ``like``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from machine import cpu_mesh

import treeguard as tg

KINDS = {
    "explicit": (AxisType.Explicit, AxisType.Explicit),
    "auto": (AxisType.Auto, AxisType.Auto),
    "mixed": (AxisType.Explicit, AxisType.Auto),
}
SPECS = {"dense": {"w": P("x", "y"), "b": P("y")}, "embed": P(None, "x"), "scale": P()}


def _host() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "dense": {
            "w": rng.standard_normal((32, 16)).astype(np.float32),
            "b": rng.standard_normal(16).astype(np.float32),
        },
        "embed": rng.integers(-100, 100, (8, 64)).astype(np.int8),
        "scale": np.float32(2.5),
    }


def _mesh(kind: str) -> jax.sharding.Mesh:
    return cpu_mesh((2, 4), ("x", "y"), KINDS[kind])


def _on(mesh: jax.sharding.Mesh) -> Any:
    return jax.tree.map(lambda h, s: jax.device_put(h, NamedSharding(mesh, s)), _host(), SPECS)


def _abstract(mesh: jax.sharding.Mesh) -> Any:
    return jax.tree.map(
        lambda h, s: jax.ShapeDtypeStruct(np.shape(h), h.dtype, sharding=NamedSharding(mesh, s)),
        _host(),
        SPECS,
    )


def _same(out: Any, like: Any) -> None:
    for x, want, h in zip(jax.tree.leaves(out), jax.tree.leaves(like), jax.tree.leaves(_host())):
        assert x.sharding == want.sharding, (x.sharding, want.sharding)
        assert np.asarray(x).tobytes() == np.asarray(h).tobytes()


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_single_file_checkpoint_loads_onto_every_axis_type(tmp_path: Path, kind: str) -> None:
    mesh = _mesh(kind)
    tg.save(tmp_path / "m.safetensors", _on(mesh))
    _same(tg.load(tmp_path / "m.safetensors", like=_on(mesh)), _on(mesh))
    _same(tg.load(tmp_path / "m.safetensors", like=_abstract(mesh)), _abstract(mesh))


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_sharded_checkpoint_round_trips_on_every_axis_type(tmp_path: Path, kind: str) -> None:
    mesh = _mesh(kind)
    tg.save_sharded(tmp_path / "ckpt", _on(mesh))
    _same(tg.load_sharded(tmp_path / "ckpt", _abstract(mesh)), _abstract(mesh))
    _same(tg.load_sharded(tmp_path / "ckpt", _on(mesh)), _on(mesh))
    # onto each other kind of axes: the restore reshards
    for other in KINDS:
        like = _abstract(_mesh(other))
        _same(tg.load_sharded(tmp_path / "ckpt", like), like)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_store_keeps_sharded_versions_on_every_axis_type(tmp_path: Path, kind: str) -> None:
    mesh = _mesh(kind)
    store = tg.ArtifactStore(tmp_path / "store")
    v = store.put_sharded(_on(mesh), metadata={"axes": kind})
    assert store.verify(v).status == "verified"
    store.promote(v)
    _same(store.load_current(_abstract(mesh)), _abstract(mesh))
    _same(store.load_verified(v, _on(mesh)), _on(mesh))
