"""Trees that would break JAX's flatten: cycles through every kind of node,
nesting thousands deep, and leaves ``save`` cannot store.

Each gets a typed error naming a path, and the interpreter works afterwards.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import treeguard as tg


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    x: Any


NT = collections.namedtuple("NT", "a b")


def _through_namedtuple() -> Any:
    items: list[Any] = []
    nt = NT(items, np.ones(1))
    items.append(nt)
    return {"nt": nt}


def _through_custom() -> Any:
    box = Box([np.ones(1)])
    box.x.append(box)
    return {"box": box}


def _through_equinox() -> Any:
    import equinox as eqx

    class Block(eqx.Module):
        parts: list[Any]

    block = Block([np.ones(1)])
    block.parts.append(block)
    return block


def _through_nnx() -> Any:
    from flax import nnx

    state = nnx.State({"w": np.ones(1)})
    state["self"] = state
    return state


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (_through_namedtuple, "['nt'].a[0]"),
        (_through_custom, "['box'].x[1]"),
        (_through_equinox, ".parts[1]"),
        (_through_nnx, "['self']"),
    ],
    ids=["namedtuple", "custom", "equinox", "nnx"],
)
def test_a_cycle_through_any_node_is_named(make: Callable[[], Any], path: str) -> None:
    tree = make()
    for fn in (tg.spec_of, lambda t: tg.check(t, t), lambda t: tg.save("/nonexistent/x", t)):
        with pytest.raises(tg.InvalidTreeError, match="contains itself") as info:
            fn(tree)
        assert info.value.path.startswith(path)
    assert tg.spec_of({"w": np.ones(2)}).num_leaves == 1


def _nested_boxes(n: int) -> Any:
    t: Any = np.ones(1)
    for _ in range(n):
        t = Box(t)
    return t


def _nested_dicts(n: int) -> Any:
    t: Any = np.ones(1)
    for _ in range(n):
        t = {"a": t}
    return t


@pytest.mark.parametrize(
    ("make", "prefix"),
    [(lambda: _nested_boxes(3000), ".x.x.x"), (lambda: _nested_dicts(30_000), "['a']['a']")],
    ids=["3000_custom_nodes", "30000_dicts"],
)
def test_deep_nesting_is_refused_and_the_interpreter_stays_usable(
    make: Callable[[], Any], prefix: str, tmp_path: Path
) -> None:
    tree = make()
    limit = sys.getrecursionlimit()
    for fn in (tg.spec_of, lambda t: tg.save(tmp_path / "d.safetensors", t)):
        with pytest.raises(tg.InvalidTreeError, match="nests more than 128 containers deep"):
            fn(tree)
    with pytest.raises(tg.InvalidTreeError) as info:
        tg.mismatches(tree, {"w": np.ones(1)})
    assert info.value.path.startswith(prefix) and info.value.path.endswith("...")
    assert sys.getrecursionlimit() == limit
    ok = {"w": np.ones(2, np.float32)}
    tg.save(tmp_path / "ok.safetensors", ok)
    assert tg.load(tmp_path / "ok.safetensors", like=ok)["w"].shape == (2,)
    assert jax.tree.leaves(ok)[0].shape == (2,)


def test_nesting_within_the_limit_round_trips(tmp_path: Path) -> None:
    tree = _nested_dicts(100)
    spec = tg.spec_of(tree)
    assert tg.TreeSpec.from_json(spec.to_json()) == spec
    tg.save(tmp_path / "d.safetensors", tree)
    assert tg.load(tmp_path / "d.safetensors", like=tree) is not None


def test_a_shared_subtree_is_not_a_cycle() -> None:
    shared = {"w": np.ones(1)}
    assert tg.spec_of({"a": shared, "b": [shared, shared]}).num_leaves == 3


@pytest.mark.parametrize(
    ("leaf", "message"),
    [
        (jax.ShapeDtypeStruct((2,), np.float32), "jax.ShapeDtypeStruct .f32\\[2\\]. describes"),
        (2**70, "a Python int outside the range of int"),
        (np.ma.masked_array([1.0, 2.0], mask=[0, 1]), "masked array"),
    ],
    ids=["shape_dtype_struct", "huge_int", "masked"],
)
def test_save_names_leaves_it_cannot_store(tmp_path: Path, leaf: Any, message: str) -> None:
    path = tmp_path / "l.safetensors"
    with pytest.raises(tg.InvalidTreeError, match=message) as info:
        tg.save(path, {"layer": {"w": leaf}})
    assert info.value.path == "['layer']['w']"
    assert not path.exists()


def test_surrogates_in_keys_and_metadata_are_typed_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    with pytest.raises(tg.InvalidTreeError, match="lone surrogate"):
        tg.save(path, {"w\udc80": np.ones(1)})
    with pytest.raises(TypeError, match=r"metadata\['note'\]: a string with a lone surrogate"):
        tg.save(path, {"w": np.ones(1)}, metadata={"note": "bad \ud800"})
    with pytest.raises(TypeError, match="a key with a lone surrogate"):
        tg.save(path, {"w": np.ones(1)}, metadata={"\ud800": 1})
    assert not path.exists()
