"""``save`` keeps the layout of the last few trees it wrote (their structure,
leaf records and metadata laid out as a header) for the next tree of the
same: a tree that differs from the one before in any leaf's shape, dtype
or weak type, in its metadata, its digest algorithm or its keys' types is
laid out anew, whatever was saved before it."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeguard import load, read_header, save, spec_of

_DTYPES = (np.float32, np.float16, np.int8, np.int32)


@st.composite
def _trees(draw: st.DrawFn) -> tuple[Any, dict[str, Any], str]:
    """A tree of one fixed structure whose leaves' shapes, dtypes and kinds
    vary, with its metadata and digest algorithm."""
    leaves = []
    for _ in range(3):
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        dtype = draw(st.sampled_from(_DTYPES))
        value = np.full(shape, draw(st.integers(0, 5)), dtype)
        kind = draw(st.sampled_from(["numpy", "jax", "scalar"]))
        if kind == "jax":
            value = jnp.asarray(value)
        elif kind == "scalar":
            value = draw(st.sampled_from([1.5, 2, True]))  # weak-typed leaves
        leaves.append(value)
    metadata = {"step": draw(st.integers(0, 3))} if draw(st.booleans()) else {}
    algorithm = draw(st.sampled_from(["blake3", "sha256"]))
    return {"a": leaves[0], "b": [leaves[1], leaves[2]]}, metadata, algorithm


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(trees=st.lists(_trees(), min_size=2, max_size=4))
def test_each_tree_saved_after_another_of_its_structure_reads_back_as_itself(
    tmp_path: Path, trees: list[tuple[Any, dict[str, Any], str]]
) -> None:
    for i, (tree, metadata, algorithm) in enumerate(trees * 2):  # each again, after the others
        path = tmp_path / f"{i}.safetensors"
        save(path, tree, metadata=metadata, digest=algorithm)
        read = read_header(path)
        assert read.spec == spec_of(tree)
        assert read.metadata == metadata
        assert read.hash_name == algorithm
        raw = path.read_bytes()
        table = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        for name, leaf in zip(["['a']", "['b'][0]", "['b'][1]"], [tree["a"], *tree["b"]]):
            assert table[name]["shape"] == list(np.shape(leaf))
        back = load(path, like=tree)
        assert [np.asarray(x).tobytes() for x in (back["a"], *back["b"])] == [
            np.asarray(x).tobytes() for x in (tree["a"], *tree["b"])
        ]


def test_keys_that_differ_only_in_type_are_laid_out_each_as_its_own(tmp_path: Path) -> None:
    x = np.ones(2, np.float32)
    for i, tree in enumerate([{1: x}, {True: x}, {1: x}]):  # one treedef, two key types
        path = tmp_path / f"{i}.safetensors"
        save(path, tree)
        assert read_header(path).spec == spec_of(tree)


def test_a_tree_saved_in_another_environment_records_that_environment(tmp_path: Path) -> None:
    tree = {"w": np.ones(2, np.float32)}
    seen = []
    for i, x64 in enumerate([False, True, False]):
        with jax.enable_x64(x64):
            save(tmp_path / f"{i}.safetensors", tree)
        seen.append(read_header(tmp_path / f"{i}.safetensors").env["x64"])
    assert seen == [False, True, False]


@pytest.mark.slow
def test_the_layouts_kept_hold_a_few_mib_whatever_was_saved(tmp_path: Path) -> None:
    """Large headers are not kept: four saves of a tree whose header is
    about 2 MB, each with other metadata, leave at most 2 MiB more held
    (kept whole, four such layouts held about 40 MB)."""
    tree = {f"{'k' * 300}{i}": np.zeros(1, np.float32) for i in range(3000)}
    save(tmp_path / "warm.safetensors", tree)  # the structure itself is cached by its treedef
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for step in range(4):
            save(tmp_path / f"{step}.safetensors", tree, metadata={"step": step})
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert read_header(tmp_path / "3.safetensors").metadata == {"step": 3}
    assert held < 2 * 2**20, held
