"""A resharded load reads each saved shard straight into the target shards
it overlaps and hashes it there, as runs of those target shards in the
saved shard's C order: a load onto grids of target parts along every axis
(views strided in the target buffers) is exactly the saved bytes, which
the saved shard's digest checks; a flipped byte in any run is refused onto
every mesh, and a shard that would split into many tiny runs is read into a
buffer of its own instead, with the same guarantees. (Where a target part
lies in another process, the shard is read into a buffer of its own:
tests/sharded/test_sharded_multihost.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from machine import cpu_mesh
from shardtools import flip_byte

import treeguard as tg

W = np.random.default_rng(11).standard_normal((64, 64)).astype(np.float32)
#: The saved shards of W are 32 x 16 (2 x 4 mesh); onto 4 x 2 each lands in two
#: target shards (rows 0-15 and 16-31 of it), onto 8 in 1-D in four.
TARGETS = {"4x2": ((4, 2), ("x", "y")), "8 in 1-D": ((8,), ("x",))}
#: Saved as 2 x 6 x 16 shards (rows over the 4 of a 2 x 4 mesh, columns over its 2).
CUBE = np.random.default_rng(5).standard_normal((8, 12, 16)).astype(np.float32)
CUBE_SAVED = P("y", "x", None)
#: Target shardings of CUBE, named by the grid of target parts one saved shard splits into.
GRIDS = {
    "1x2x2": ((4, 2), ("x", "y"), P(None, "x", "y")),
    "2x1x1": ((8,), ("x",), P("x", None, None)),
    "1x1x2": ((2, 2, 2), ("x", "y", "z"), P("x", "y", "z")),
    "1x1x8": ((8,), ("x",), P(None, None, "x")),
    "1x2x1": ((2, 2, 2), ("x", "y", "z"), P("x", ("y", "z"), None)),
    "1x1x4, replicated": ((2, 4), ("x", "y"), P(None, None, "y")),
}


def _save(directory: Path, tree: Any, specs: Any) -> None:
    mesh = cpu_mesh((2, 4), ("x", "y"))
    tg.save_sharded(
        directory, jax.tree.map(lambda h, s: jax.device_put(h, NamedSharding(mesh, s)), tree, specs)
    )


def _like(tree: Any, mesh_shape: tuple[int, ...], names: tuple[str, ...], specs: Any) -> Any:
    mesh = cpu_mesh(mesh_shape, names)
    return jax.tree.map(
        lambda h, s: jax.ShapeDtypeStruct(h.shape, h.dtype, sharding=NamedSharding(mesh, s)),
        tree,
        specs,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("runs") / "ckpt"
    _save(directory, {"w": W, "cube": CUBE}, {"w": P("x", "y"), "cube": CUBE_SAVED})
    return directory


@pytest.mark.parametrize("grid", list(GRIDS))
def test_a_saved_shard_read_into_a_grid_of_target_parts_is_the_saved_bytes(
    saved: Path, grid: str
) -> None:
    shape, names, spec = GRIDS[grid]
    like = _like({"w": W, "cube": CUBE}, shape, names, {"w": P(), "cube": spec})
    out = tg.load_sharded(saved, like)["cube"]  # each saved shard's digest is checked
    assert out.sharding == like["cube"].sharding
    assert np.asarray(out).tobytes() == CUBE.tobytes()
    for shard in out.addressable_shards:
        assert np.asarray(shard.data).tobytes() == CUBE[shard.index].tobytes()


# the first run of a saved shard, a run of its second target part, its last run
@pytest.mark.parametrize("where", [(0, slice(0, 4)), (20, slice(20, 24)), (31, slice(44, 48))])
def test_a_flipped_byte_in_any_run_is_refused_onto_every_mesh(
    saved: Path, tmp_path: Path, where: tuple[int, slice]
) -> None:
    for name, (shape, names) in TARGETS.items():
        like = _like({"w": W, "cube": CUBE}, shape, names, {"w": P(*names), "cube": P()})
        assert np.asarray(tg.load_sharded(saved, like)["w"]).tobytes() == W.tobytes(), name
    shutil.copytree(saved, tmp_path / "ckpt")
    flip_byte(tmp_path / "ckpt", W[where].tobytes())
    for name, (shape, names) in TARGETS.items():
        like = _like({"w": W, "cube": CUBE}, shape, names, {"w": P(*names), "cube": P()})
        with pytest.raises(tg.IntegrityError, match="does not match the manifest") as e:
            tg.load_sharded(tmp_path / "ckpt", like)
        assert e.value.path == "['w']", name


def test_a_shard_of_many_tiny_runs_is_read_whole_and_checked(tmp_path: Path) -> None:
    # saved in rows (4096 x 2 shards), loaded in columns: 8192 runs of 4 bytes a shard
    tall = {"t": np.random.default_rng(3).standard_normal((8192, 2)).astype(np.float32)}
    _save(tmp_path / "ckpt", tall, {"t": P("x", None)})
    like = _like(tall, (2,), ("x",), {"t": P(None, "x")})
    out = tg.load_sharded(tmp_path / "ckpt", like)["t"]
    assert np.asarray(out).tobytes() == tall["t"].tobytes()
    for shard in out.addressable_shards:
        assert np.asarray(shard.data).tobytes() == tall["t"][shard.index].tobytes()
    flip_byte(tmp_path / "ckpt", tall["t"][5000:5002].tobytes())
    with pytest.raises(tg.IntegrityError, match="does not match the manifest") as e:
        tg.load_sharded(tmp_path / "ckpt", like)
    assert e.value.path == "['t']"
