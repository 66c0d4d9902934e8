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


#: The child: a put of new bytes (argv[3] "fine-tune": of a tree a verified
#: load handed back, two leaves changed) interrupted (Ctrl-C) at its Nth wait
#: on the calling thread for a thread's work (argv[2]: N), or once its name's
#: reservation is submitted ("submitted"), or once its candidate record is
#: renamed over its writing one ("renamed"), or while its log's line is
#: synced ("logged"); "put" once it returned.
_INTERRUPTED = """
import os, sys, threading
from concurrent.futures import Future
import numpy as np
from treeguard import ArtifactStore
from treeguard._src import kept  # _src: where the put submits its first task, the reservation
store = ArtifactStore.init(sys.argv[1], dedup=True)
base = {"a": np.ones(1000, np.float32), "b": np.ones(10, np.float32), "c": np.zeros(5, np.float32)}
v = store.put(base)
store.verify(v)
store.promote(v)
if sys.argv[3] == "fine-tune":
    tree = store.load_current(base)
    tree = {**tree, "a": tree["a"] + 2, "c": tree["c"] + 3}
else:
    tree = {k: x + 1 for k, x in base.items()}
at = sys.argv[2]
real_submit, real_replace = kept.Job.submit, os.replace
def submit(self, fn, *a, **k):
    kept.Job.submit = real_submit
    real_submit(self, fn, *a, **k)
    raise KeyboardInterrupt
def replace(src, dst, *a, **k):
    real_replace(src, dst, *a, **k)
    if str(dst).endswith("status.json") and '"candidate"' in open(dst).read():
        raise KeyboardInterrupt
waits = [0]
def interrupted(real):
    def wait(self, timeout=None):
        if threading.current_thread() is threading.main_thread():
            waits[0] += 1
            if str(waits[0]) == at:
                raise KeyboardInterrupt
        return real(self, timeout)
    return wait
real_fsync = os.fsync
def fsync(fd):
    real_fsync(fd)
    if os.readlink(f"/proc/self/fd/{fd}").endswith("log.jsonl"):
        os.fsync = real_fsync
        raise KeyboardInterrupt
if at == "submitted":
    kept.Job.submit = submit
elif at == "renamed":
    os.replace = replace
elif at == "logged":
    os.fsync = fsync
Future.exception, Future.result = interrupted(Future.exception), interrupted(Future.result)
try:
    store.put(tree)
    print("put", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _whole_or_nothing(root: Path) -> None:
    """What an interrupted put leaves: its version whole (a candidate, its
    log's line, every tensor: it verifies) or nothing a later put, gc or
    verify trips on (no version, no line, no temp file, which gc would
    keep while the process lives: only objects no manifest names)."""
    store = ArtifactStore(root)
    listed = store.versions()
    assert [i.version for i in listed] == [e.version for e in store.history() if e.action == "put"]
    assert [i.status for i in listed] in (["verified"], ["verified", "candidate"])
    assert not [p for p in _area(root) if p.startswith(".")]
    assert all(store.verify(i.version).status == "verified" for i in listed)
    store.gc()
    tree = {
        "a": np.full(1000, 7, np.float32),
        "b": np.ones(10, np.float32),
        "c": np.ones(5, np.float32),
    }
    assert store.verify(store.put(tree)).status == "verified"  # the child's tree, new bytes


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
def test_a_put_interrupted_at_each_wait_ends_and_leaves_it_whole_or_nothing(
    tmp_path: Path, kind: str
) -> None:
    """Interrupted at any wait for its threads (the tensors' writes, the
    links, the manifest, the record, the record's sync), a put ends (its
    manifest's writer no longer waits forever for the tensors) and leaves
    its version whole or nothing of it."""
    for n in range(1, 40):
        root = tmp_path / f"store{n}"
        # a hang is a TimeoutExpired
        done = run_python(_INTERRUPTED, str(root), str(n), kind, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        if done.stdout.split() == ["put"]:
            break
        assert done.stdout.split() == ["interrupted"], done.stderr[-2000:]
        _whole_or_nothing(root)
    else:
        pytest.fail("the put was interrupted at every one of 39 waits")
    assert n > 4  # interrupted at its writes', its links' and its manifest's waits


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
@pytest.mark.parametrize("at", ["submitted", "renamed"])
def test_a_put_interrupted_as_its_name_is_asked_for_or_its_record_renamed_leaves_no_trace(
    tmp_path: Path, at: str, kind: str
) -> None:
    """Interrupted between two waits, once its name's reservation is handed
    to a thread (which goes on to reserve it) or once its candidate record
    is renamed in (before its log's line), a put leaves nothing: the
    reservation is taken back once its thread has ended."""
    root = tmp_path / "store"
    done = run_python(_INTERRUPTED, str(root), at, kind, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["interrupted"], done.stderr[-2000:]
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified"]
    _whole_or_nothing(root)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="tells the log's fd by /proc")
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
def test_a_put_interrupted_once_its_log_s_line_is_written_keeps_its_version(
    tmp_path: Path, kind: str
) -> None:
    """Interrupted while its log's line is synced, a put keeps its version
    whole: the line names it."""
    root = tmp_path / "store"
    done = run_python(_INTERRUPTED, str(root), "logged", kind, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["interrupted"], done.stderr[-2000:]
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified", "candidate"]
    _whole_or_nothing(root)


#: The child: a fine-tune put while another writer holds the store's lock
#: (a gc deleting a large version, a process stopped while it held it), and
#: Ctrl-C sent to the calling thread once the put waits for that lock; then
#: the lock is let go, and what is left is printed.
_INTERRUPTED_AT_THE_LOCK = """
import fcntl, os, sys, threading
import numpy as np
from treeguard import ArtifactStore
root = sys.argv[1]
store = ArtifactStore.init(root, dedup=True)
base = {"a": np.ones(1000, np.float32), "b": np.ones(10, np.float32)}
v = store.put(base)
store.verify(v)
store.promote(v)
tree = store.load_current(base)
tree = {**tree, "a": tree["a"] + 2}
held = os.open(os.path.join(root, ".lock"), os.O_RDWR)
fcntl.flock(held, fcntl.LOCK_EX)  # another open file: the put's flock would wait for it
real = fcntl.flock
def flock(fd, op):  # Ctrl-C while the put waits for the lock, as Python raises it there
    if fd != held:
        if threading.current_thread() is not threading.main_thread():
            print("waited on another thread", flush=True)  # which no Ctrl-C ends
            os._exit(3)
        raise KeyboardInterrupt
    return real(fd, op)
fcntl.flock = flock
try:
    store.put(tree)
    print("put", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
fcntl.flock = real
os.close(held)
print(*[i.status for i in store.versions()])
print(len([n for n in os.listdir(os.path.join(root, "tensors")) if n.startswith(".")]), "temps")
print(len(os.listdir(os.path.join(root, "versions"))), "versions")
"""


@pytest.mark.slow
def test_a_put_waiting_for_another_writer_s_lock_ends_when_interrupted(tmp_path: Path) -> None:
    """Ctrl-C while a put waits for the store's lock (held by another
    writer for as long as it likes) ends the put at once, leaving nothing:
    the wait is on the calling thread, not on a thread the put must then
    wait for before it can take back what it started."""
    done = run_python(_INTERRUPTED_AT_THE_LOCK, str(tmp_path / "store"), timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["interrupted", "verified", "0 temps", "1 versions"]
