"""A dedup store's put after a verified load (the digest memo): the jax
arrays a load handed back are not read again, so a fine-tune's put writes
only what changed; an entry never outlives its array, numpy leaves are
never trusted, and every load still checks every byte."""

from __future__ import annotations

import gc
import json
import os
import weakref
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import treeguard as tg
from tests.machine import cpu_mesh
from tests.subproc import ROOT

# the memo's entries (what it holds, what a host copy carries) have no public face
from treeguard._src.hashing import memo  # _src: the digest memo's entries
from treeguard.examples import cnn, eqx_mlp, mlp

CHESS = ROOT / "tests" / "data" / "chess_cv_pieces.safetensors"


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


def _round_trip(root: Path, params: Any) -> None:
    """Put, load onto jax arrays, put the loaded tree unchanged (no object
    added, the same digest), then with one leaf changed (one object added)."""
    store = tg.ArtifactStore.init(root, dedup=True)
    v1 = store.put(params)
    held = _objects(root)
    loaded = _current(store, v1, params)
    assert _same(loaded, params)
    v2 = store.put(loaded)
    assert _objects(root) == held
    assert store.verify(v2).digest == store.verify(v1).digest
    leaves, treedef = jax.tree.flatten(loaded)
    leaves[0] = leaves[0] + 1
    changed = jax.tree.unflatten(treedef, leaves)
    v3 = store.put(changed)
    assert len(_objects(root) - held) == 1
    assert _same(_current(store, v3, params), changed)


@pytest.mark.parametrize(
    "make",
    [
        lambda: mlp.init(jax.random.key(0)),
        lambda: cnn.init(jax.random.key(0)),
        lambda: eqx_mlp.init(jax.random.key(0)),
    ],
    ids=["mlp", "nnx_cnn", "eqx_mlp"],
)
def test_the_bundled_models_round_trip_through_a_fine_tune(tmp_path: Path, make: Any) -> None:
    _round_trip(tmp_path / "store", make())


def test_a_third_party_file_round_trips_through_a_fine_tune(tmp_path: Path) -> None:
    foreign = tg.read_foreign(CHESS, names="flat")
    _round_trip(tmp_path / "store", {k: jnp.asarray(v) for k, v in foreign.items()})


def test_leaves_on_an_explicit_mesh_come_back_on_their_sharding(tmp_path: Path) -> None:
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
    _round_trip(tmp_path / "store", params)
    store = tg.ArtifactStore(tmp_path / "store")
    loaded = store.load_current(params)
    assert {k: x.sharding for k, x in loaded.items()} == shardings


def test_a_fine_tune_s_put_writes_only_the_changed_tensor(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    tree = {f"l{i}": np.full((16, 4), i, np.float32) for i in range(6)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    before = _objects(root)
    for step in range(3):
        params = {**params, "l2": params["l2"] + 100}
        v = store.put(params)
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
    store = tg.ArtifactStore.init(tmp_path / "store", dedup=True)
    tree = {f"l{i}": np.full(4, i, np.float32) for i in range(3)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    ids = {id(x) for x in params.values()}
    assert ids <= memo.held()
    refs = [weakref.ref(x) for x in params.values()]
    del params
    gc.collect()
    assert all(r() is None for r in refs) and not ids & memo.held()


def test_numpy_leaves_are_read_again_whatever_a_load_gave(tmp_path: Path) -> None:
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
    assert _same(store.load_version(store.put(mixed)), now)


def test_a_non_blocking_put_carries_the_memo_s_digests_to_its_host_copy(tmp_path: Path) -> None:
    # the carried digests have no public face: they are read from the memo
    from treeguard._src.checkpoint.asyncsave import host_copy  # _src: the copy that carries them

    root = tmp_path / "store"
    store = tg.ArtifactStore.init(root, dedup=True)
    tree = {f"l{i}": np.full((16, 4), i, np.float32) for i in range(4)}
    params = _current(store, store.put(tree), {k: jnp.asarray(v) for k, v in tree.items()})
    changed = {**params, "l2": params["l2"] + 100, "l1": np.asarray(params["l1"])}
    carried = memo.Carried("blake3")
    host = host_copy(changed, carried.add)
    for k in ("l0", "l3"):  # loaded and verified: their copies carry the digests
        assert carried.known(host[k], "blake3") == memo.known(params[k], "blake3") is not None
        assert carried.known(host[k], "sha256") is None  # another algorithm: not known
        assert carried.known(host[k].copy(), "blake3") is None  # only that very copy
    assert carried.known(host["l2"], "blake3") is None  # a new array: hashed by the put
    assert carried.known(host["l1"], "blake3") is None  # numpy: never trusted
    before = _objects(root)
    v = store.put(changed, block=False).result()
    assert len(_objects(root) - before) == 1  # the changed tensor
    assert _same(_current(store, v, changed), changed)
