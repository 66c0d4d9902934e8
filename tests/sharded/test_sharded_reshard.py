"""Loading a sharded checkpoint onto other meshes, in process on 8 CPU
devices: each target (the same mesh, another shape, another device count,
one dimension, one device, other axis types) gets exactly the saved bytes
with the shardings of ``like``; a flipped byte is found onto every one of
them, and a stored array that is not what the manifest records is refused
by name before any of its bytes is used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from machine import cpu_devices, cpu_mesh
from shardtools import MANIFEST_NAME, flip_byte

import treeguard as tg


def _host() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "dense": {
            "w": rng.standard_normal((64, 64)).astype(np.float32),
            "b": rng.standard_normal(64).astype(jnp.bfloat16),
        },
        "embed": rng.integers(-100, 100, (8, 64)).astype(np.int8),
        "mask": rng.integers(0, 2, (16, 8)).astype(bool),
        "scale": np.float32(2.5),
    }


SAVED = {
    "dense": {"w": P("x", "y"), "b": P("y")},
    "embed": P(None, "x"),
    "mask": P("y", None),
    "scale": P(),
}
EXPLICIT = (AxisType.Explicit, AxisType.Explicit)
AUTO = (AxisType.Auto, AxisType.Auto)
#: Each target: a mesh (shape, names, axis types) and the partition of each leaf.
TARGETS: dict[str, tuple[tuple[int, ...], tuple[str, ...], Any, Any]] = {
    "same 2x4": ((2, 4), ("x", "y"), EXPLICIT, SAVED),
    "4x2": ((4, 2), ("x", "y"), EXPLICIT, SAVED),
    "4x2 auto": ((4, 2), ("x", "y"), AUTO, SAVED),
    "4x2 transposed": (
        (4, 2),
        ("x", "y"),
        EXPLICIT,
        {"dense": {"w": P("y", "x"), "b": P("x")}, "embed": P("y", "x"), "mask": P(), "scale": P()},
    ),
    "8 in 1-D rows": (
        (8,),
        ("x",),
        (AxisType.Explicit,),
        {"dense": {"w": P("x"), "b": P("x")}, "embed": P("x"), "mask": P("x"), "scale": P()},
    ),
    "8 in 1-D columns auto": (
        (8,),
        ("x",),
        (AxisType.Auto,),
        {"dense": {"w": P(None, "x"), "b": P()}, "embed": P(None, "x"), "mask": P(), "scale": P()},
    ),
    "2 devices": (
        (2,),
        ("x",),
        (AxisType.Explicit,),
        {"dense": {"w": P(None, "x"), "b": P("x")}, "embed": P("x"), "mask": P("x"), "scale": P()},
    ),
}


def _saved(directory: Path) -> None:
    mesh = cpu_mesh((2, 4), ("x", "y"), EXPLICIT)
    tree = jax.tree.map(lambda h, s: jax.device_put(h, NamedSharding(mesh, s)), _host(), SAVED)
    tg.save_sharded(directory, tree)


def _like(name: str) -> Any:
    if name == "one device":
        one = jax.sharding.make_single_device_sharding(cpu_devices(8)[5])
        return jax.tree.map(
            lambda h: jax.ShapeDtypeStruct(np.shape(h), np.asarray(h).dtype, sharding=one), _host()
        )
    shape, names, types, specs = TARGETS[name]
    mesh = cpu_mesh(shape, names, types)
    return jax.tree.map(
        lambda h, s: jax.ShapeDtypeStruct(
            np.shape(h), np.asarray(h).dtype, sharding=NamedSharding(mesh, s)
        ),
        _host(),
        specs,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("reshard") / "ckpt"
    _saved(directory)
    return directory


@pytest.mark.parametrize("name", [*TARGETS, "one device"])
def test_each_target_mesh_gets_exactly_the_saved_bytes(saved: Path, name: str) -> None:
    like = _like(name)
    out = tg.load_sharded(saved, like)
    for got, want, host in zip(
        jax.tree.leaves(out), jax.tree.leaves(like), jax.tree.leaves(_host())
    ):
        assert got.sharding == want.sharding, (name, got.sharding, want.sharding)
        assert got.dtype == want.dtype
        assert np.asarray(got).tobytes() == np.asarray(host).tobytes(), name
        for shard in got.addressable_shards:  # every device holds its own part, exactly
            assert np.asarray(shard.data).tobytes() == np.asarray(host)[shard.index].tobytes()


def test_a_flipped_byte_is_found_onto_every_other_mesh(tmp_path: Path) -> None:
    _saved(tmp_path / "ckpt")
    flip_byte(tmp_path / "ckpt", _host()["dense"]["w"][40, 16:20].tobytes())
    for name in [*TARGETS, "one device"]:
        with pytest.raises(tg.IntegrityError, match="does not match the manifest") as e:
            tg.load_sharded(tmp_path / "ckpt", _like(name))
        assert e.value.path == "['dense']['w']", name
        assert "1 array with a shard" in str(e.value), name
    # an array of another shard is untouched, and loads alone onto any mesh
    part = tg.load_sharded(tmp_path / "ckpt", _like("4x2")["embed"], subtree="['embed']")
    assert np.asarray(part).tobytes() == _host()["embed"].tobytes()


def test_a_stored_array_other_than_its_record_is_refused_by_name(tmp_path: Path) -> None:
    _saved(tmp_path / "ckpt")
    # the manifest and its spec say int32 where float32 is stored (the same bytes)
    doc = json.loads((tmp_path / "ckpt" / MANIFEST_NAME).read_text())
    doc["arrays"][1]["dtype"] = "int32"
    text = json.dumps(doc).replace('"float32"', '"int32"')
    (tmp_path / "ckpt" / MANIFEST_NAME).write_text(text)
    like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, jnp.int32 if x.dtype == jnp.float32 else x.dtype, sharding=x.sharding
        ),
        _like("4x2"),
    )
    with pytest.raises(tg.IntegrityError, match=r"is f32\[64,64\], the manifest records") as e:
        tg.load_sharded(tmp_path / "ckpt", like)
    assert e.value.path in ("['dense']['w']", "['scale']")
