"""A dedup store's put after a verified load (the digest memo): the jax
arrays a load handed back are not read again, so a fine-tune's put writes
only what changed; an entry never outlives its array, numpy leaves are
never trusted, and every load still checks every byte."""

from __future__ import annotations

import gc
import json
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import treeguard as tg
from tests.drawn import cnn_params
from tests.machine import cpu_mesh
from tests.subproc import ROOT
from treeguard.examples import eqx_mlp, mlp

CHESS = ROOT / "tests" / "data" / "chess_cv_pieces.safetensors"


_BLAKE3 = blake3.blake3
#: Each digest a BLAKE3 hasher gave while one was watched (one hasher per leaf hashed).
_GIVEN: list[str] = []


class _NotingBlake3:
    """A BLAKE3 hasher that notes each digest it gives, from whichever thread."""

    AUTO = _BLAKE3.AUTO

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._real = _BLAKE3(*args, **kwargs)

    def update(self, data: Any) -> None:
        self._real.update(data)

    def hexdigest(self) -> str:
        found = str(self._real.hexdigest())
        _GIVEN.append(found)
        return found


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``hashed(tree)``: the keys of ``tree``'s leaves whose bytes were hashed
    since the last call (treeguard looks ``blake3.blake3`` up on each hash)."""

    def leaves_hashed(tree: Any) -> set[str]:
        given = set(_GIVEN)
        _GIVEN.clear()
        return {
            jax.tree_util.keystr(path)
            for path, x in jax.tree_util.tree_leaves_with_path(tree)
            if _BLAKE3(np.asarray(x).tobytes()).hexdigest() in given
        }

    _GIVEN.clear()
    monkeypatch.setattr(blake3, "blake3", _NotingBlake3)
    yield leaves_hashed
    _GIVEN.clear()


def _objects(root: Path) -> set[str]:
    return {p.name for p in (root / "tensors").iterdir() if not p.name.startswith(".")}


def _same(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _current(store: tg.ArtifactStore, version: str, like: Any) -> Any:
    assert store.verify(version).status == "verified"
    store.promote(version)
    return store.load_current(like)


def _round_trip(root: Path, params: Any, hashed: Any) -> None:
    """Put, load onto jax arrays, put the loaded tree unchanged (no leaf
    hashed, no object added, the same digest), then with one leaf changed
    (that leaf alone hashed, one object added)."""
    store = tg.ArtifactStore.init(root, dedup=True)
    v1 = store.put(params)
    held = _objects(root)
    loaded = _current(store, v1, params)
    assert _same(loaded, params)
    hashed(loaded)
    v2 = store.put(loaded)
    assert hashed(loaded) == set()
    assert _objects(root) == held
    assert store.verify(v2).digest == store.verify(v1).digest
    leaves, treedef = jax.tree.flatten(loaded)
    leaves[0] = leaves[0] + 1
    changed = jax.tree.unflatten(treedef, leaves)
    hashed(changed)
    v3 = store.put(changed)
    (first, _), *_ = jax.tree_util.tree_leaves_with_path(changed)
    assert hashed(changed) == {jax.tree_util.keystr(first)}
    assert len(_objects(root) - held) == 1
    assert _same(_current(store, v3, params), changed)


@pytest.mark.parametrize(
    "make",
    [
        lambda: mlp.init(jax.random.key(0)),
        lambda: cnn_params(0),  # cnn.init's form, no initializer compiled
        lambda: eqx_mlp.init(jax.random.key(0)),
    ],
    ids=["mlp", "nnx_cnn", "eqx_mlp"],
)
def test_the_bundled_models_round_trip_through_a_fine_tune(
    tmp_path: Path, make: Any, hashed: Any
) -> None:
    _round_trip(tmp_path / "store", make(), hashed)


def test_a_third_party_file_round_trips_through_a_fine_tune(tmp_path: Path, hashed: Any) -> None:
    foreign = tg.read_foreign(CHESS, names="flat")
    _round_trip(tmp_path / "store", {k: jnp.asarray(v) for k, v in foreign.items()}, hashed)


def test_leaves_on_an_explicit_mesh_come_back_on_their_sharding(
    tmp_path: Path, hashed: Any
) -> None:
    mesh = cpu_mesh((2, 4), ("x", "y"), (AxisType.Explicit,) * 2)
    shardings = {
        "w": NamedSharding(mesh, PartitionSpec("x", "y")),
        "b": NamedSharding(mesh, PartitionSpec("y")),
        "s": NamedSharding(mesh, PartitionSpec()),
    }
    values = {
        "w": np.arange(64, dtype=np.float32).reshape(8, 8),
        "b": np.arange(8, dtype=np.float32),
        "s": np.float32(3.0),
    }
    params = {k: jax.device_put(v, shardings[k]) for k, v in values.items()}
    _round_trip(tmp_path / "store", params, hashed)
    store = tg.ArtifactStore(tmp_path / "store")
    loaded = store.load_current(params)
    assert {k: x.sharding for k, x in loaded.items()} == shardings


def test_a_fine_tune_s_put_writes_only_the_changed_tensor(tmp_path: Path, hashed: Any) -> None:
    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    tree = {f"l{i}": np.full((16, 4), i, np.float32) for i in range(8)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    before = _objects(root)
    for step in range(3):
        params = {**params, "l2": params["l2"] + 100}
        hashed(params)
        v = store.put(params)
        assert hashed(params) == {"['l2']"}  # 1 of 8 leaves read and hashed
        added = _objects(root) - before
        assert len(added) == 1  # the changed tensor, nothing else
        (name,) = added
        assert (root / "tensors" / name).read_bytes() == np.full(
            (16, 4), 102 + 100 * step, np.float32
        ).tobytes()
        before |= added
        manifest = json.loads((root / "versions" / v / "tensors.json").read_text())
        assert name in manifest["objects"]


def test_a_tampered_object_is_refused_on_load_though_the_memo_knows_its_digest(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    tree = {"a": np.full(8, 1.0, np.float32), "b": np.full(8, 2.0, np.float32)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    manifest = json.loads((root / "versions" / store.current() / "tensors.json").read_text())
    target = root / "tensors" / manifest["objects"][1]  # b's
    os.chmod(target, 0o644)
    target.write_bytes(np.full(8, 9.0, np.float32).tobytes())  # same size, other bytes
    v = store.put({**params, "a": params["a"] + 10})  # b's digest from the memo, its object reused
    with pytest.raises(tg.IntegrityError) as e:
        store.load_version(v)
    assert e.value.path == "['b']" and e.value.version == v
    assert store.verify(v).status == "rejected"


def test_a_deleted_or_donated_array_is_not_put_from_its_digest(tmp_path: Path) -> None:
    store = tg.ArtifactStore.init(tmp_path / "store", dedup=True)
    tree = {"a": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    params["a"].delete()
    with pytest.raises(RuntimeError, match="deleted"):
        store.put(params)
    again = store.load_current({k: jnp.asarray(v) for k, v in tree.items()})
    jax.jit(lambda x: x * 2, donate_argnums=0)(again["b"])  # donated (deleted on the CPU too)
    assert again["b"].is_deleted()
    with pytest.raises(RuntimeError, match="deleted"):
        store.put(again)


def test_an_entry_is_gone_once_its_array_is_freed(tmp_path: Path) -> None:
    """The memo watches each loaded array by a weak reference whose callback
    drops its entry: once the array is freed, nothing but this test holds
    that reference (the entry that held it is gone), and the array was not
    kept alive."""
    store = tg.ArtifactStore.init(tmp_path / "store", dedup=True)
    tree = {f"l{i}": np.full(4, i, np.float32) for i in range(3)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    watched = [
        [r for r in weakref.getweakrefs(x) if r.__callback__ is not None] for x in params.values()
    ]
    assert all(len(rs) == 1 for rs in watched)  # one entry per loaded array
    refs = [rs[0] for rs in watched]
    del watched
    held = [[o for o in gc.get_referrers(r) if o is not refs] for r in refs]
    assert all(held), held  # each entry holds its reference while its array lives
    del params, held
    gc.collect()
    assert all(r() is None for r in refs)
    assert [[o for o in gc.get_referrers(r) if o is not refs] for r in refs] == [[]] * 3


def test_numpy_leaves_are_read_again_whatever_a_load_gave(tmp_path: Path, hashed: Any) -> None:
    """A numpy leaf can change in place, and on the CPU a jax array of the
    same load may share its buffer: neither is trusted by a later put."""
    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    n = 1 << 20  # read into one mapped buffer, which JAX shares on the CPU
    tree = {"a": np.full(n, 1.0, np.float32), "b": np.full(n, 2.0, np.float32)}
    v = store.put(tree)
    mixed = _current(store, v, {"a": tree["a"], "b": jax.ShapeDtypeStruct((n,), np.float32)})
    assert isinstance(mixed["a"], np.ndarray) and isinstance(mixed["b"], jax.Array)
    base = mixed["a"]
    while isinstance(base.base, np.ndarray):
        base = base.base
    base[...] = 0  # the whole buffer the load read into, b's bytes too where b shares it
    mixed["a"][...] = 5.0
    now = {k: np.asarray(x).copy() for k, x in mixed.items()}
    hashed(now)
    put = store.put(mixed)
    assert hashed(now) == {"['a']", "['b']"}  # b too: it may share a's buffer
    assert _same(store.load_version(put), now)


def test_a_digest_remembered_under_blake3_is_not_taken_for_sha256(tmp_path: Path) -> None:
    # an object named by a's BLAKE3 digest as if it were a SHA-256 one, with
    # other bytes: a SHA-256 put of the loaded a hashes it, and never uses it
    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    tree = {"a": np.full(8, 1.0, np.float32), "b": np.full(8, 2.0, np.float32)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    blake = _BLAKE3(tree["a"].tobytes()).hexdigest()
    (root / "tensors" / f"sha256-{blake}").write_bytes(np.full(8, 9.0, np.float32).tobytes())
    v = store.put(params, digest="sha256")
    assert store.verify(v).status == "verified"
    assert _same(store.load_version(v), tree)


def test_a_non_blocking_put_carries_the_memo_s_digests_to_its_host_copy(
    tmp_path: Path, hashed: Any
) -> None:
    # the put copies its leaves to the host before it returns: the copies of
    # loaded, verified arrays are not hashed; a new array and a numpy leaf are
    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    tree = {f"l{i}": np.full((16, 4), i, np.float32) for i in range(4)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    changed = {**params, "l2": params["l2"] + 100, "l1": np.asarray(params["l1"])}
    before = _objects(root)
    hashed(changed)
    v = store.put(changed, block=False).result()
    assert hashed(changed) == {"['l1']", "['l2']"}
    assert len(_objects(root) - before) == 1  # the changed tensor
    assert _same(_current(store, v, changed), changed)
