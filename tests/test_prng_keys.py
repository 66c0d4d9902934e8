"""Typed PRNG key arrays (flax.nnx Rngs, jax.random.key) save and load as keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx
from forge import forge

import treeguard as tg

#: JAX's key implementations: the tag of their dtype name and their key data's shape.
IMPLS = {"threefry2x32": ("fry", (2,)), "rbg": ("rbg", (4,)), "unsafe_rbg": ("urbg", (4,))}


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(4, 8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.drop(nnx.relu(self.lin(x))))


def test_nnx_model_with_dropout_and_rngs_round_trips(tmp_path: Path) -> None:
    model = Net(nnx.Rngs(params=0, dropout=1))
    x = jnp.ones((3, 4))
    model(x)  # advance the dropout stream once before saving
    graphdef, state = nnx.split(model)
    path = tmp_path / "net.safetensors"
    tg.save(path, state)
    spec = tg.read_header(path).spec
    assert "key<fry>[]" in {leaf.summary() for leaf in spec.leaves}
    # The like-tree is abstract (jax.ShapeDtypeStruct leaves, typed keys included).
    abstract = nnx.split(nnx.eval_shape(lambda: Net(nnx.Rngs(params=5, dropout=6))))[1]
    loaded = tg.load(path, like=abstract)
    # every leaf a jax.Array, as the structs describe: a numpy RNG count would be
    # bumped in place by nnx while a computation JAX queued on an alias of it
    # still reads it (a flaky dropout mask, seen under load)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded))
    restored = nnx.merge(graphdef, loaded)
    outs = []
    for _ in range(2):  # the streams continue identically, and they do advance
        a, b = model(x), restored(x)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        outs.append(np.asarray(a))
    assert not np.array_equal(outs[0], outs[1])
    a_state, b_state = nnx.split(model)[1], nnx.split(restored)[1]
    tg.check(b_state, tg.spec_of(a_state))


@pytest.mark.parametrize(
    ("impl", "shape"),
    [("threefry2x32", ()), ("threefry2x32", (0,)), ("threefry2x32", (2, 2))]
    + [(impl, (3,)) for impl in list(IMPLS)[1:]],
    ids=str,
)
def test_keys_of_every_impl_round_trip(tmp_path: Path, impl: str, shape: tuple[int, ...]) -> None:
    """Every key implementation of JAX saves and loads as itself: fails loudly
    if JAX renames one, its dtype's tag or the shape of its key data."""
    tag, key_shape = IMPLS[impl]
    keys = jax.random.split(jax.random.key(7, impl=impl), max(1, int(np.prod(shape))))
    keys = keys[: int(np.prod(shape))].reshape(shape)
    assert keys.dtype.name == f"key<{tag}>"
    tree = {"k": keys, "w": jnp.ones(2)}
    path = tmp_path / "k.safetensors"
    tg.save(path, tree)
    assert (
        tg.read_header(path).spec.leaves[0].summary() == f"key<{tag}>[{','.join(map(str, shape))}]"
    )
    for out in (tg.load(path, like=tree), tg.load(path)):
        assert out["k"].dtype == keys.dtype and out["k"].shape == shape
        assert str(jax.random.key_impl(out["k"])) == impl
        assert jax.random.key_data(out["k"]).shape == (*shape, *key_shape)
        np.testing.assert_array_equal(jax.random.key_data(out["k"]), jax.random.key_data(keys))
    tg.verify_file(path, like=tree)
    raw = safetensors.numpy.load_file(str(path))["['k']"]  # any reader sees the raw key data
    assert raw.dtype == np.uint32 and raw.shape == (*shape, *key_shape)


def test_spec_json_names_the_key_dtype() -> None:
    spec = tg.spec_of({"k": jax.random.key(0, impl="rbg")})
    text = spec.to_json()
    assert '"dtype": "key<rbg>"' in text
    assert tg.TreeSpec.from_json(text) == spec
    assert tg.LeafSpec((), "key<fry>").summary() == "key<fry>[]"


def test_typed_against_raw_is_a_dtype_mismatch_with_hint(tmp_path: Path) -> None:
    key = jax.random.key(0)
    typed, raw = {"k": key}, {"k": jax.random.key_data(key)}
    path = tmp_path / "raw.safetensors"
    tg.save(path, raw)
    with pytest.raises(tg.TreeMismatchError) as e:
        tg.load(path, like=typed)
    assert {(m.kind, m.expected, m.actual) for m in e.value.mismatches} >= {
        ("dtype", "key<fry>", "uint32")
    }
    assert "wrap_key_data" in str(e.value)
    tg.save(path, typed)
    with pytest.raises(tg.TreeMismatchError, match="key_data") as e:
        tg.load(path, like=raw)
    assert ("dtype", "uint32", "key<fry>") in {
        (m.kind, m.expected, m.actual) for m in e.value.mismatches
    }
    with pytest.raises(tg.TreeMismatchError, match="key<rbg> in `like`, key<fry>"):
        tg.load(path, like={"k": jax.random.key(0, impl="rbg")})


def test_foreign_raw_keys_against_typed_like(tmp_path: Path) -> None:
    path = tmp_path / "f.safetensors"
    safetensors.numpy.save_file({"k": np.zeros(2, np.uint32)}, str(path))
    with pytest.raises(tg.TreeMismatchError, match="wrap_key_data"):
        tg.load(path, like={"k": jax.random.key(0)}, names="dotted", unverified="allow")


def _forge_spec(path: Path, old: str, new: str) -> None:
    """Rewrites the stored spec with a consistent digest, as an attacker could."""

    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.spec"] = meta["treeguard.spec"].replace(old, new)

    forge(path, mutate)


def test_unknown_impl_in_a_hostile_file_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "k.safetensors"
    tg.save(path, {"k": jax.random.key(0)})
    _forge_spec(path, "key<fry>", "key<evil>")
    for read in (tg.read_header, tg.load, tg.verify_file):
        with pytest.raises(tg.FormatError, match="unknown PRNG key implementation 'key<evil>'"):
            read(path)
    with pytest.raises(tg.FormatError, match="unknown PRNG key"):
        tg.LeafSpec((), "key<evil>")


def test_key_dtype_shape_forgery_refused(tmp_path: Path) -> None:
    """A spec that turns key<fry> into key<rbg> must still match the stored table."""
    path = tmp_path / "k.safetensors"
    tg.save(path, {"k": jax.random.split(jax.random.key(0), 2)})
    _forge_spec(path, "key<fry>", "key<rbg>")
    with pytest.raises(tg.FormatError, match="shape"):
        tg.load(path)


def test_key_of_a_custom_impl_refused_on_save(tmp_path: Path) -> None:
    from jax.extend import random as jr

    base = jr.threefry_prng_impl
    impl = jr.define_prng_impl(
        key_shape=(2,),
        seed=base.seed,
        split=base.split,
        random_bits=base.random_bits,
        fold_in=base.fold_in,
        name="mine",
        tag="mine",
    )
    with pytest.raises(tg.InvalidTreeError, match=r"\['k'\]: typed PRNG key array of unknown"):
        tg.save(tmp_path / "w.safetensors", {"k": jax.random.key(0, impl=impl)})
    assert not (tmp_path / "w.safetensors").exists()
