"""Migrations relax only what they name: container types are still compared."""

from __future__ import annotations

import dataclasses
import os
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


# -- a newcomer's own nnx and equinox models through every model-change path ---------


def _same_values(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(
            np.asarray(jax.random.key_data(x) if _is_key(x) else x),
            np.asarray(jax.random.key_data(y) if _is_key(y) else y),
        )
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def test_init_takes_an_equinox_module_as_values_not_as_a_function(tmp_path: Path) -> None:
    import equinox as eqx
    from nnxmodels import eqx_net

    path = tmp_path / "old.safetensors"
    old = eqx.filter(eqx_net(jax.random.key(0), head=False), eqx.is_array)
    tg.save(path, old)
    model = eqx_net(jax.random.key(1), head=True)  # callable, and a tree of arrays
    params = eqx.filter(model, eqx.is_array)
    for init in (model, params):
        tree, report = tg.load(path, like=params, missing="init", init=init, report=True)
        assert type(tree) is type(params)
        assert _same_values(tree.encoder, old.encoder)
        assert _same_values(tree.head, params.head)
        assert [(c.action, c.path) for c in report.changes] == [
            ("initialised", ".head.bias"),
            ("initialised", ".head.weight"),
        ]


def test_init_as_a_function_is_called_with_each_new_path(tmp_path: Path) -> None:
    from flax import nnx
    from nnxmodels import NEW_STATE, Net, new_leaf

    path = tmp_path / "old.safetensors"
    tg.save(path, nnx.state(Net(nnx.Rngs(0))))
    tree = tg.load(path, like=NEW_STATE, missing="init", init=new_leaf)
    assert type(tree) is type(NEW_STATE)
    assert not np.asarray(tree["head"]["kernel"][...]).any()


def test_init_that_is_neither_a_tree_nor_a_function_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    tg.save(path, {"w": _ones(2)})
    with pytest.raises(tg.ConfigError) as info:
        tg.load(path, like={"w": _ones(2), "h": _ones(1)}, missing="init", init="zeros")
    assert str(info.value) == (
        "init: a tree of arrays (the new model's params) or a function of a key path, got str\n"
        "hint: pass init=new_params, or init=lambda path: array"
    )


def test_a_none_becomes_a_layer_only_for_missing_init(tmp_path: Path) -> None:
    import equinox as eqx
    from nnxmodels import eqx_net

    path = tmp_path / "old.safetensors"
    tg.save(path, eqx.filter(eqx_net(jax.random.key(0), head=False), eqx.is_array))
    params = eqx.filter(eqx_net(jax.random.key(1), head=True), eqx.is_array)
    with pytest.raises(tg.TreeMismatchError) as info:  # allow_missing keeps like's, not a None
        tg.load(path, like=params, allow_missing=[".head"])
    assert [(m.path, m.kind) for m in info.value.mismatches] == [(".head", "node_type")]
    assert tg.load(path, like=params, missing="init", init=params).head is not None


def _cli_migrate(tmp_path: Path, *args: str) -> Any:
    from subproc import ROOT, run_module

    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    return run_module("treeguard", ["ckpt", "migrate", *args], env=env, cwd=tmp_path)


def _nnx_old_and_spec(tmp_path: Path) -> tuple[Path, Path, Any]:
    from flax import nnx
    from nnxmodels import NEW_STATE, Net

    old = tmp_path / "old.safetensors"
    state = nnx.state(Net(nnx.Rngs(0)))
    tg.save(old, state)
    spec = tmp_path / "new.json"
    tg.spec_of(NEW_STATE).save(spec)
    return old, spec, state


def _in_process(*args: str) -> Any:
    from click.testing import CliRunner

    from treeguard._cli.main import main

    return CliRunner().invoke(main, ["ckpt", "migrate", *args])


@pytest.mark.parametrize(
    "init", [pytest.param("nnxmodels:NEW_STATE", marks=pytest.mark.slow), "nnxmodels:new_leaf"]
)
def test_ckpt_migrate_keeps_the_nnx_state_of_like(tmp_path: Path, init: str) -> None:
    from nnxmodels import NEW_STATE

    old, spec, state = _nnx_old_and_spec(tmp_path)
    new = tmp_path / "new.safetensors"
    args = (str(old), str(new), "--like", str(spec), "--init", init)
    if init.endswith("NEW_STATE"):  # the documented command, as a user runs it
        done = _cli_migrate(tmp_path, *args)
        assert done.returncode == 0, done.stderr
        out = done.stdout
    else:  # the function form, in this process
        result = _in_process(*args)
        assert result.exit_code == 0, result.output
        out = result.output
    assert "initialised ['head']['kernel'].value f32[2,3]" in out
    assert tg.read_header(new).spec == tg.spec_of(NEW_STATE)
    tree = tg.load(new, like=NEW_STATE)  # the live State, BatchNorm's stats and the rng streams
    assert type(tree) is type(NEW_STATE)
    assert _same_values(tree["norm"], state["norm"])
    assert _same_values(tree["drop"], state["drop"])


def test_a_failed_ckpt_migrate_writes_nothing_at_new(tmp_path: Path) -> None:
    old, spec, _ = _nnx_old_and_spec(tmp_path)
    new = tmp_path / "new.safetensors"
    done = _cli_migrate(tmp_path, str(old), str(new), "--like", str(spec))  # no --init
    assert done.returncode == 1
    assert "['head']: missing" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.safetensors"]
    new.write_bytes(b"kept")  # a file already at NEW is left as it was
    done = _cli_migrate(tmp_path, str(old), str(new), "--like", str(spec), "--drop", "['nope']")
    assert done.returncode != 0
    assert new.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "new.json",
        "new.safetensors",
        "old.safetensors",
    ]


def test_a_migrate_that_fails_after_writing_leaves_no_temporary_file(tmp_path: Path) -> None:
    old, spec, _ = _nnx_old_and_spec(tmp_path)
    new = tmp_path / "new.safetensors"
    new.mkdir()  # written and verified, then the rename onto NEW fails
    result = _in_process(str(old), str(new), "--like", str(spec), "--init", "nnxmodels:NEW_STATE")
    assert result.exit_code == 2
    assert "Is a directory" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "new.json",
        "new.safetensors",
        "old.safetensors",
    ]
    assert new.is_dir() and not any(new.iterdir())


def test_init_of_another_form_than_an_nnx_like_names_the_form(tmp_path: Path) -> None:
    from flax import nnx
    from nnxmodels import Net, NetWithHead

    path = tmp_path / "old.safetensors"
    tg.save(path, nnx.state(Net(nnx.Rngs(0))))
    bigger = NetWithHead(nnx.Rngs(1))
    with pytest.raises(tg.TreeMismatchError) as info:  # the module: its paths are attributes
        tg.load(path, like=nnx.state(bigger), missing="init", init=bigger)
    assert [(m.path, m.kind) for m in info.value.mismatches] == [
        ("['head']['bias'].value", "missing"),
        ("['head']['kernel'].value", "missing"),
    ]
    assert str(info.value).splitlines()[-1] == (
        "hint: init gives each leaf the checkpoint lacks its value, of `like`'s shape and "
        "dtype, at `like`'s key path: pass the new model's params in `like`'s form "
        "(nnx.state(new_model), not the module)"
    )
