"""A dedup store's put, whose writes overlap (the name's reservation, the
new tensors, the manifest): a kill between any two of them leaves no
visible version that names a missing tensor, a refused name leaves no
object, and bytes the store holds are not kept twice."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import blake3
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.subproc import run_python
from treeguard import ArtifactStore, StoreError


def _tree() -> dict[str, Any]:
    return {
        "body": {f"l{i}": np.full((32, 8), i, np.float32) for i in range(4)},
        "head": np.zeros(8, np.float32),
    }


def _like() -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _tree())


def _store(root: Path) -> ArtifactStore:
    store = ArtifactStore.init(root, dedup=True)
    v = store.put(_tree())
    store.verify(v)
    store.promote(v)
    return store


def _area(root: Path) -> set[str]:
    """Every name in ``tensors/``, temp files included."""
    return {p.name for p in (root / "tensors").iterdir()}


#: The child: a fine-tune put (the memo knows every leaf but the head), with
#: a SIGKILL at its Nth fsync, link or rename (N: argv[2]); "put" once it returned.
_KILLED_AT = """
import os, signal, sys
import jax, numpy as np
from treeguard import ArtifactStore
store = ArtifactStore(sys.argv[1])
like = {"body": {f"l{i}": jax.ShapeDtypeStruct((32, 8), np.float32) for i in range(4)},
        "head": jax.ShapeDtypeStruct((8,), np.float32)}
params = store.load_current(like)
params["head"] = params["head"] + 1.0
calls = [0]
def deadly(real):
    def call(*a, **k):
        calls[0] += 1
        if calls[0] == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    return call
os.fsync, os.link, os.replace = deadly(os.fsync), deadly(os.link), deadly(os.replace)
store.put(params)
print("put", flush=True)
"""


def _no_visible_version_misses_a_tensor(root: Path) -> None:
    store = ArtifactStore(root)
    held = _area(root)
    for info in store.versions():
        if info.status == "writing":
            continue
        manifest = json.loads((root / "versions" / info.version / "tensors.json").read_text())
        assert set(manifest["objects"]) <= held, info.version
        assert store.verify(info.version).status == "verified"
    store.gc()
    assert not [p for p in _area(root) if p.startswith(".")]  # no temp left by gc
    assert store.load_current(_tree())["head"][0] == 0.0


@pytest.mark.slow
def test_a_put_killed_between_its_overlapped_writes_leaves_no_version_missing_a_tensor(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    _store(root)
    for n in range(1, 40):
        done = run_python(_KILLED_AT, str(root), str(n))
        if done.returncode == 0:
            assert done.stdout.split() == ["put"]
            break
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        _no_visible_version_misses_a_tensor(root)
    else:
        pytest.fail("the put was killed at every one of 39 writes")
    assert n > 8  # killed at each of its writes: the reservation's, the tensor's, the manifest's
    store = ArtifactStore(root)
    last = store.versions()[-1]
    assert last.status == "candidate"
    assert store.verify(last.version).status == "verified"
    store.promote(last.version)
    assert store.load_current(_tree())["head"][0] == 1.0


def test_a_put_whose_name_is_refused_leaves_no_tensor(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = _store(root)
    params = store.load_current(_like())  # the memo knows them: the head is written eagerly
    before = _area(root)
    with pytest.raises(StoreError, match="already exists"):
        store.put({**params, "head": params["head"] + 1.0}, version=store.versions()[0].version)
    assert _area(root) == before


def test_a_leaf_the_memo_does_not_know_but_the_store_holds_is_not_kept_twice(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = _store(root)
    params = store.load_current(_like())
    before = _area(root)
    copy = jnp.array(np.asarray(params["body"]["l1"]))  # the same bytes, unknown to the memo
    v = store.put({**params, "body": {**params["body"], "l1": copy}})
    assert _area(root) == before  # its temp dropped, no second object
    assert store.verify(v).status == "verified"


def test_a_fine_tune_changing_more_leaves_than_are_written_at_once_keeps_each(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = _store(root)
    params = store.load_current(_like())  # the memo knows the head: the rest are written eagerly
    before = _area(root)
    body = {k: x + 10.0 for k, x in params["body"].items()}  # four new tensors, two at a time
    v = store.put({**params, "body": body})
    added = _area(root) - before
    assert len(added) == 4 and not [n for n in added if n.startswith(".")]
    assert store.verify(v).status == "verified"
    store.promote(v)
    assert store.load_current(_tree())["body"]["l3"][0, 0] == 13.0


def _created_in_tensors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files created in a store's ``tensors/`` from now on
    (``os.open`` with ``O_CREAT`` watched)."""
    created: list[str] = []
    real = os.open

    def watched(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and os.path.basename(os.path.dirname(str(path))) == "tensors":
            created.append(os.path.basename(str(path)))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watched)
    return created


def test_numpy_copies_of_held_tensors_beside_a_loaded_leaf_are_hashed_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    store = _store(root)
    params = store.load_current(_like())  # the memo knows the head
    copies = {k: np.array(x) for k, x in params["body"].items()}  # held bytes, unknown to it
    created = _created_in_tensors(monkeypatch)
    v = store.put({"body": copies, "head": params["head"]})
    monkeypatch.undo()
    assert created == []  # no leaf staged: each numpy copy was found held first
    assert store.verify(v).status == "verified"


def test_a_put_interrupted_while_it_hashes_a_leaf_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    store = _store(root)
    params = store.load_current(_like())
    before = _area(root)
    new_head = params["head"] + 1.0  # a jax array the memo does not know: staged as hashed
    created = _created_in_tensors(monkeypatch)

    class Interrupted:  # a hasher interrupted (Ctrl-C) at its first bytes
        AUTO = blake3.blake3.AUTO

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def update(self, data: Any) -> Any:
            raise KeyboardInterrupt

    monkeypatch.setattr(blake3, "blake3", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.put({**params, "head": new_head})
    monkeypatch.undo()
    assert created  # the head's temp was being written while it was hashed
    assert _area(root) == before  # and is gone
