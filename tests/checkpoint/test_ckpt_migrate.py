"""Migrations relax only what they name: container types are still compared."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import treeguard as tg


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Net:
    w: Any
    b: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Other:
    w: Any
    b: Any


def _ones(n: int) -> Any:
    return np.ones(n, np.float32)


def test_rename_does_not_load_a_list_into_a_tuple(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    tg.save(path, {"old": [_ones(1), _ones(2)]})
    like = {"new": (_ones(1), _ones(2))}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like=like, rename={"['old']": "['new']"})
    assert [(m.path, m.kind, m.expected, m.actual) for m in info.value.mismatches] == [
        ("['new']", "node_type", "tuple", "list")
    ]
    ok = tg.load(path, like={"new": [_ones(1), _ones(2)]}, rename={"['old']": "['new']"})
    assert isinstance(ok["new"], list)


def test_allow_missing_does_not_load_one_class_into_another(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    tg.save(path, {"net": Net(_ones(1), _ones(2))})
    like = {"net": Other(_ones(1), _ones(2)), "head": _ones(3)}
    with pytest.raises(tg.TreeMismatchError, match="node_type|Net") as info:
        tg.load(path, like=like, allow_missing=["['head']"])
    (m,) = info.value.mismatches
    assert (m.path, m.kind) == ("['net']", "node_type")
    assert m.expected.endswith("Other") and m.actual.endswith("Net")
    out = tg.load(
        path, like={"net": Net(_ones(1), _ones(2)), "head": _ones(3)}, allow_missing=["['head']"]
    )
    assert isinstance(out["net"], Net)


def test_rename_of_a_leaf_still_compares_the_containers_around_it(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    tg.save(path, Net(_ones(1), _ones(2)))
    like = Other(_ones(1), _ones(2))
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like=like, rename={".w": ".w"})
    assert [m.kind for m in info.value.mismatches] == ["node_type"]
    assert info.value.mismatches[0].path == ""


def test_a_renamed_subtree_keeps_its_inner_types_checked(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    tg.save(path, {"enc": {"layers": [_ones(1)]}})
    like = {"encoder": {"layers": (_ones(1),)}}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like=like, rename={"['enc']": "['encoder']"})
    assert [(m.path, m.kind) for m in info.value.mismatches] == [
        ("['encoder']['layers']", "node_type")
    ]
