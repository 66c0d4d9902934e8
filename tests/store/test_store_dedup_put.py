"""A dedup store's put, whose writes overlap (the name's reservation, the
new tensors, the manifest): a kill between any two of them leaves no
visible version that names a missing tensor, every entry it made is
durable before its record (a file put's too), a refused name or a full
disk leaves no object, and bytes the store holds are not kept twice."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import blake3
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.subproc import run_on_a_small_disk, run_python
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
    """The names of the leaves' temp files created in a store's ``tensors/``
    from now on (``os.open`` with ``O_CREAT`` watched; the manifest's temp,
    also staged there, is not a leaf's)."""
    created: list[str] = []
    real = os.open

    def watched(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        name = os.path.basename(str(path))
        in_area = os.path.basename(os.path.dirname(str(path))) == "tensors"
        if flags & os.O_CREAT and in_area and not name.startswith(".tensors.json."):
            created.append(name)
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


#: The child, on a 1 MiB disk: a dedup store of small tensors, then a put of
#: a fine-tune (a new jax leaf staged while it is hashed) and of a numpy tree,
#: each with a new leaf of 4 MiB; what each put raised, and what is left.
_FILL_DISK = """
import os, sys
import jax, jax.numpy as jnp, numpy as np
from treeguard import ArtifactStore, StorageError
root = sys.argv[1]
store = ArtifactStore.init(root, dedup=True)
base = {"body": {"w": np.ones((16, 16), np.float32)}, "head": np.zeros(8, np.float32)}
v = store.put(base)
store.verify(v)
store.promote(v)
params = store.load_current(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), base))
for tree in ({**params, "extra": jnp.ones((1024, 1024))},
             {**base, "body": {"w": base["body"]["w"], "big": np.ones((1024, 1024), np.float32)}}):
    try:
        store.put(tree)
    except StorageError as e:
        print(type(e).__name__, e.version, str(e).splitlines()[0].split(": ", 1)[1])
print(*[i.version for i in store.versions()])
print(len([n for n in os.listdir(os.path.join(root, "tensors")) if n.startswith(".")]), "temps")
print(store.load_current(base)["body"]["w"][0, 0])
"""


@pytest.mark.slow
def test_a_full_disk_while_a_tensor_is_staged_names_the_version_and_the_leaf(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    done = run_on_a_small_disk(_FILL_DISK, disk, "size=1m", f"{disk}/store")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "StorageError v000002 writing version v000002 failed at ['extra']: no space left on "
        "the device",
        "StorageError v000003 writing version v000003 failed at ['body']['big']: no space left "
        "on the device",
        "v000001",  # nothing of either put is kept
        "0 temps",
        "1.0",
    ]


def _watched_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every ``mkdir``, ``link``, ``rename`` and ``fsync`` from now on, in
    order, as ``(op, path, source)``: an fsync names the file or directory
    its descriptor is open on (read from ``/proc``)."""
    events: list[tuple[str, str, str]] = []
    for op in ("mkdir", "link", "replace", "rename", "fsync"):
        real = getattr(os, op)

        def watched(*a: Any, _op: str = op, _real: Any = real, **k: Any) -> Any:
            if _op == "fsync":
                events.append(("fsync", os.readlink(f"/proc/self/fd/{a[0]}"), ""))
            out = _real(*a, **k)
            if _op != "fsync":
                target = str(a[1] if _op in ("link", "replace", "rename") else a[0])
                events.append((_op, os.path.abspath(target), str(a[0]) if len(a) > 1 else ""))
            return out

        monkeypatch.setattr(os, op, watched)
    return events


@pytest.mark.parametrize("dedup", [True, False], ids=["tensors", "file"])
def test_a_put_makes_every_entry_durable_before_the_record_that_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dedup: bool
) -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = _store(root) if dedup else ArtifactStore.init(root)
    params = store.load_current(_like()) if dedup else _tree()
    events = _watched_writes(monkeypatch)
    v = store.put({**params, "head": params["head"] + 1.0})
    monkeypatch.undo()
    record = str(root / "versions" / v / "status.json")
    last = max(i for i, (op, path, _) in enumerate(events) if path == record and op != "fsync")
    synced = {path for op, path, _ in events[last:] if op == "fsync"}
    assert str(root / "versions" / v) in synced  # the record itself, before put returns
    renamed = set()
    for i, (op, path, source) in enumerate(events[:last]):
        if op == "fsync":
            continue
        later = {p for o, p, _ in events[i + 1 : last] if o == "fsync"}
        assert os.path.dirname(path) in later, (op, path)  # its entry, before the record
        if source:  # a file renamed or linked (the manifest too): its bytes synced before
            assert ("fsync", source, "") in events[:i], (op, path)
            renamed.add(os.path.basename(path))
    assert not dedup or "tensors.json" in renamed


def test_a_fine_tune_s_tensor_is_written_while_its_name_is_reserved_and_synced_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first tensor's bytes are written while the name is reserved, and
    the reservation's fsyncs come before the tensor's fsync and link
    (issued while a tensor's bytes were being synced, they waited behind
    them). The reservation is held until the tensor's temp file is open."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = _store(root)
    params = store.load_current(_like())
    events = _watched_writes(monkeypatch)
    opened = threading.Event()
    held: list[bool] = []
    real_open, real_host = os.open, socket.gethostname

    def open_(path: Any, *a: Any, **k: Any) -> int:
        if ".staged." in str(path):
            opened.set()
        return real_open(path, *a, **k)

    def host() -> str:  # the writing record's, on the reserving thread
        if threading.current_thread() is not threading.main_thread():
            held.append(opened.wait(30))  # the tensor's temp opened meanwhile
        return real_host()

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(socket, "gethostname", host)
    v = store.put({**params, "head": params["head"] + 1.0})
    monkeypatch.undo()
    assert held == [True]  # reserved on a thread, the tensor written meanwhile
    record = str(root / "versions" / v / "status.json")
    reserved = next(
        i for i, (op, path, _) in enumerate(events) if op == "replace" and path == record
    )
    assert ("fsync", str(root / "versions" / v), "") not in events[:reserved]  # left to the batch
    first = min(
        i for i, (op, path, _) in enumerate(events) if path.startswith(str(root / "tensors"))
    )
    assert reserved < first
