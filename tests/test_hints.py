"""Hints for equinox modules: an unfiltered module, and a renamed class."""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeguard as tg

FILTER_HINT = (
    "hint: an equinox module holds config beside its arrays (activations, sizes, non-array "
    "fields); take its arrays with `eqx.filter(model, eqx.is_array)` and check or save "
    "those, or mark config fields `eqx.field(static=True)`"
)


def _mlp() -> eqx.nn.MLP:
    return eqx.nn.MLP(2, 3, 4, 1, key=jax.random.key(0))


@pytest.mark.parametrize("wrap", [lambda m: m, lambda m: {"model": m, "step": np.zeros(())}])
def test_an_unfiltered_equinox_module_is_refused_with_eqx_filter(
    wrap: object, tmp_path: Path
) -> None:
    tree = wrap(_mlp())  # type: ignore[operator]
    for use in (
        tg.spec_of,
        lambda t: tg.check(t, tg.spec_of(eqx.filter(_mlp(), eqx.is_array))),
        lambda t: tg.save(tmp_path / "m.safetensors", t),
    ):
        with pytest.raises(tg.InvalidTreeError) as info:
            use(tree)
        message = str(info.value)
        assert "activation: leaf of type custom_jvp is not an array" in message
        assert message.endswith(FILTER_HINT), message
    params = eqx.filter(_mlp(), eqx.is_array)
    tg.save(tmp_path / "m.safetensors", params)
    assert tg.spec_of(params).num_leaves == 4


def test_other_trees_keep_the_static_fields_hint() -> None:
    with pytest.raises(tg.InvalidTreeError) as info:
        tg.spec_of({"w": jnp.zeros(2), "act": jax.nn.relu})
    assert str(info.value).endswith(
        "hint: keep only arrays in a parameter tree; hold config in static fields"
    )


class MLP(eqx.Module):
    w: jax.Array
    b: jax.Array


class Renamed(eqx.Module):
    w: jax.Array
    b: jax.Array


def test_a_renamed_class_names_both_classes_and_how_to_load(tmp_path: Path) -> None:
    path = tmp_path / "mlp.safetensors"
    tg.save(path, MLP(jnp.ones((2, 2)), jnp.zeros(2)))
    old, new = f"{MLP.__module__}.MLP", f"{Renamed.__module__}.Renamed"
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like=Renamed(jnp.ones((2, 2)), jnp.zeros(2)))
    assert str(info.value) == (
        f"{path}: 1 mismatch between the checkpoint and `like`:\n"
        f"  <root>: node type {new} in `like`, {old} in the checkpoint\n"
        f"hint: <root> is class `{new}` in `like` and `{old}` in the checkpoint: the class "
        "was renamed or moved (its module and qualified name are part of the contract). "
        "To load the arrays anyway, load without `like=` (they come back as dicts by key "
        "path) and build the new class from them, or give the class its old name and "
        "module again"
    )
    loaded = tg.load(path)  # the way the hint gives
    rebuilt = Renamed(**loaded)
    assert rebuilt.w.shape == (2, 2) and rebuilt.b.shape == (2,)
    with pytest.raises(tg.TreeMismatchError, match="the class was renamed or moved"):
        tg.check(Renamed(jnp.ones((2, 2)), jnp.zeros(2)), tg.spec_of(MLP(**loaded)))


def test_a_list_turned_tuple_keeps_the_container_hint() -> None:
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.check((jnp.zeros(1),), tg.spec_of([jnp.zeros(1)]))
    assert str(info.value).endswith(
        "hint: a container changed kind (e.g. list vs tuple) or its static data changed"
    )
