"""A resharded load reads each saved shard straight into the target shards
it overlaps and hashes it there, as runs of those target shards in the
saved shard's C order: the runs are exactly the saved bytes for any grid of
parts and any strides, a flipped byte in any run is refused onto every
mesh, and a shard that would split into many tiny runs is read into a
buffer of its own instead, with the same guarantees."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from machine import cpu_mesh
from shardtools import flip_byte

import treeguard as tg
from treeguard._src.sharded.runs import Runs, grid  # _src: the runs of arbitrary grids

W = np.random.default_rng(11).standard_normal((64, 64)).astype(np.float32)
#: The saved shards of W are 32 x 16 (2 x 4 mesh); onto 4 x 2 each lands in two
#: target shards (rows 0-15 and 16-31 of it), onto 8 in 1-D in four.
TARGETS = {"4x2": ((4, 2), ("x", "y")), "8 in 1-D": ((8,), ("x",))}


@st.composite
def tilings(draw: Any) -> tuple[np.ndarray[Any, Any], list[Any], list[Any]]:
    """An array, a grid of regions tiling it, and each region as a view of a
    larger buffer of its own (padded on every side, so strided)."""
    shape = tuple(draw(st.lists(st.integers(1, 6), max_size=3)))
    arr = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    axes = []
    for n in shape:
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=2)) if n > 1 else set())
        bounds = [0, *cuts, n]
        axes.append(list(itertools.pairwise(bounds)))
    regions = [tuple(r) for r in itertools.product(*axes)]
    views = []
    for region in regions:
        pad = [draw(st.integers(0, 2)) for _ in region]
        buf = np.full([hi - lo + 2 * p for (lo, hi), p in zip(region, pad)], -1, np.int32)
        at: Any = (..., *(slice(p, p + hi - lo) for (lo, hi), p in zip(region, pad)))
        buf[at] = arr[(..., *(slice(lo, hi) for lo, hi in region))]
        views.append(buf[at])
    return arr, regions, views


@settings(max_examples=200, deadline=None)
@given(tilings())
def test_the_runs_are_the_saved_bytes_in_c_order(case: Any) -> None:
    arr, regions, views = case
    shard = tuple((0, n) for n in arr.shape)
    runs = Runs(shard, regions, views)
    got = [bytes(run) for run in runs]
    assert b"".join(got) == arr.tobytes()
    assert len(got) == len(runs)
    assert runs.nbytes == arr.nbytes


def test_regions_that_do_not_tile_the_shard_are_refused() -> None:
    shard = ((0, 4), (0, 4))
    assert grid(shard, [((0, 2), (0, 4)), ((2, 4), (0, 4))]) == [[(0, 2), (2, 4)], [(0, 4)]]
    assert grid(shard, [((0, 2), (0, 4))]) is None  # a part this process does not hold
    assert grid(shard, [((0, 4), (0, 4)), ((0, 2), (0, 4))]) is None  # overlapping
    bricks = [((0, 2), (0, 2)), ((0, 2), (2, 4)), ((2, 4), (0, 3)), ((2, 4), (3, 4))]
    assert grid(shard, bricks) is None  # a tiling, but not a grid
    views = [np.zeros((2, 4), np.float32)]
    with pytest.raises(ValueError, match="do not tile the shard"):
        Runs(shard, [((0, 2), (0, 4))], views)


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
    _save(directory, {"w": W}, {"w": P("x", "y")})
    return directory


# the first run of a saved shard, a run of its second target part, its last run
@pytest.mark.parametrize("where", [(0, slice(0, 4)), (20, slice(20, 24)), (31, slice(44, 48))])
def test_a_flipped_byte_in_any_run_is_refused_onto_every_mesh(
    saved: Path, tmp_path: Path, where: tuple[int, slice]
) -> None:
    for name, (shape, names) in TARGETS.items():
        like = _like({"w": W}, shape, names, {"w": P(*names)})
        assert np.asarray(tg.load_sharded(saved, like)["w"]).tobytes() == W.tobytes(), name
    shutil.copytree(saved, tmp_path / "ckpt")
    flip_byte(tmp_path / "ckpt", W[where].tobytes())
    for name, (shape, names) in TARGETS.items():
        like = _like({"w": W}, shape, names, {"w": P(*names)})
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
