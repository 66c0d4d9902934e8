"""A dedup store's put interrupted (Ctrl-C): it ends, and leaves its
version whole (its record, its log's line, every tensor) or nothing a
later put, gc or verify trips on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.subproc import run_python
from treeguard import ArtifactStore


def _area(root: Path) -> set[str]:
    """Every name in ``tensors/``, temp files included."""
    return {p.name for p in (root / "tensors").iterdir()}


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
