"""A dedup store's put interrupted (Ctrl-C) anywhere, once or again while
it takes back what it started: it ends, and leaves its version whole (its
record, its log's line, every tensor) or nothing a later put, gc or verify
trips on; no thread of it writes once it has raised."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.subproc import run_python
from treeguard import ArtifactStore


def _area(root: Path) -> set[str]:
    """Every name in ``tensors/``, temp files included."""
    return {p.name for p in (root / "tensors").iterdir()}


# CTRL_C_RAISES: each child below installs Python's own SIGINT handler first: a
# process started with SIGINT ignored (a job a shell put in the background, as
# a CI runner may) passes that on, Python then installs none, and Ctrl-C would
# do nothing there (every test below failed so, put never interrupted).

#: The child: a put of new bytes (argv[2] "fine-tune": of a tree a verified
#: load handed back, two leaves changed) sent Ctrl-C (SIGINT, through its
#: handler, as a terminal sends it) where each hook (argv[3:]) says: "wait:N"
#: as the calling thread's Nth wait for a thread's work reads its outcome
#: (``Future.result`` or ``exception``); "renamed"
#: once its candidate record is renamed over its writing one; "logged" once
#: its log's line is synced; "FILE|TEXT|N" as the Nth line holding TEXT in the
#: file ending FILE is about to run on the calling thread (traced, so between
#: any two bytecodes the code keeps on separate lines). It prints "put" once
#: the put returned, else "interrupted", and the index of each hook that
#: sent Ctrl-C, in the order sent.
_INTERRUPTED = """
import linecache, os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # see CTRL_C_RAISES
from concurrent.futures import Future
import numpy as np
from treeguard import ArtifactStore
store = ArtifactStore.init(sys.argv[1], dedup=True)
base = {"a": np.ones(1000, np.float32), "b": np.ones(10, np.float32), "c": np.zeros(5, np.float32)}
v = store.put(base)
store.verify(v)
store.promote(v)
if sys.argv[2] == "fine-tune":
    tree = store.load_current(base)
    tree = {**tree, "a": tree["a"] + 2, "c": tree["c"] + 3}
else:
    tree = {k: x + 1 for k, x in base.items()}
hooks = sys.argv[3:]
sent = []
def ctrl_c(hook):
    sent.append(str(hooks.index(hook)))
    signal.raise_signal(signal.SIGINT)  # the handler raises KeyboardInterrupt here, or holds it
real_replace, real_fsync = os.replace, os.fsync
def replace(src, dst, *a, **k):
    real_replace(src, dst, *a, **k)
    if str(dst).endswith("status.json") and '"candidate"' in open(dst).read():
        ctrl_c("renamed")
def fsync(fd):
    real_fsync(fd)
    if os.readlink(f"/proc/self/fd/{fd}").endswith("log.jsonl"):
        os.fsync = real_fsync
        ctrl_c("logged")
waits = [0]
def interrupted(real):
    def wait(self, timeout=None):
        if threading.current_thread() is threading.main_thread():
            waits[0] += 1
            if f"wait:{waits[0]}" in hooks:
                ctrl_c(f"wait:{waits[0]}")
        return real(self, timeout)
    return wait
lines = [[*h.split("|"), h] for h in hooks if "|" in h]
def at_line(frame, event, arg):
    if event == "line":
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        for hook in lines:
            if frame.f_code.co_filename.endswith(hook[0]) and hook[1] in text:
                hook[2] = str(int(hook[2]) - 1)
                if hook[2] == "0":
                    ctrl_c(hook[3])
    return at_line
def traced(frame, event, arg):
    return at_line if any(frame.f_code.co_filename.endswith(h[0]) for h in lines) else None
if "renamed" in hooks:
    os.replace = replace
if "logged" in hooks:
    os.fsync = fsync
Future.exception, Future.result = interrupted(Future.exception), interrupted(Future.result)
if lines:
    sys.settrace(traced)
try:
    store.put(tree)
    print("put", *sent, flush=True)
except KeyboardInterrupt:
    print("interrupted", *sent, flush=True)
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


def _interrupted(root: Path, kind: str, *hooks: str) -> tuple[str, list[int]]:
    """Runs the child (``_INTERRUPTED``) on a store at ``root``: whether its
    put returned ("put") or raised ("interrupted"), and which hooks sent
    Ctrl-C (their indices, in the order sent). A put that hangs is a
    ``TimeoutExpired``."""
    done = run_python(_INTERRUPTED, str(root), kind, *hooks, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome, *sent = done.stdout.split()
    return outcome, [int(i) for i in sent]


def _each(root: Path, kind: str, hooks: Callable[[int], list[str]]) -> int:
    """Runs the child with ``hooks(n)`` for n = 1, 2, ... until the first
    hook sent no Ctrl-C (the put got past it), checking what each put
    left; the last n."""
    for n in range(1, 40):
        outcome, sent = _interrupted(root / f"store{n}", kind, *hooks(n))
        assert outcome == ("interrupted" if sent else "put"), hooks(n)
        _whole_or_nothing(root / f"store{n}")
        if 0 not in sent:
            return n
    pytest.fail(f"the put was interrupted at every one of 39 places: {hooks(39)}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
def test_a_put_interrupted_at_each_wait_ends_and_leaves_it_whole_or_nothing(
    tmp_path: Path, kind: str
) -> None:
    """Interrupted at any wait for its threads (the tensors' writes, the
    links, the manifest, the record, the record's sync), a put ends (its
    manifest's writer no longer waits forever for the tensors) and leaves
    its version whole or nothing of it."""
    # interrupted at its writes', its links' and its manifest's waits
    assert _each(tmp_path, kind, lambda n: [f"wait:{n}"]) > 4


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
@pytest.mark.parametrize("again", ["settle", "next wait"])
def test_a_put_interrupted_again_while_it_takes_back_its_work_leaves_nothing_behind(
    tmp_path: Path, again: str, kind: str
) -> None:
    """Ctrl-C at any wait, then again as the put waits for its threads to
    end (the pool's settle) or at its next wait for a thread's work: the
    put waits for every thread before it removes anything, and removes all
    they wrote (before, the second Ctrl-C ended the settle, or the wait of
    the put's cleanup for a write it then removed: the reservation, still
    being made on its thread, was left ``writing``, or a temp file left)."""
    settle = "_src/kept.py|wait(self._submitted)|1"
    _each(tmp_path, kind, lambda n: [f"wait:{n}", settle if again == "settle" else f"wait:{n + 1}"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
def test_a_put_interrupted_as_it_hands_a_task_to_its_threads_leaves_nothing_behind(
    tmp_path: Path, kind: str
) -> None:
    """Ctrl-C inside the pool's ``submit``, between a task's submit and the
    note that the put must wait for it (each task: the reservation, the
    writes, the record, the manifest, the syncs): the put waits for that
    task too before it takes back its work (before, the reservation's
    thread went on and left a ``writing`` version of a live process)."""
    _each(tmp_path, kind, lambda n: [f"_src/kept.py|self._submitted.append(future)|{n}"])


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
    hook = "_src/kept.py|return future|1" if at == "submitted" else at
    assert _interrupted(root, kind, hook) == ("interrupted", [0])
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified"]
    _whole_or_nothing(root)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="tells the log's fd by /proc")
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
@pytest.mark.parametrize("at", ["written", "logged"])
def test_a_put_interrupted_once_its_log_s_line_is_written_keeps_its_version(
    tmp_path: Path, at: str, kind: str
) -> None:
    """Interrupted once its log's line is written, as the put notes it (two
    bytecodes) or while the line is synced, a put keeps its version whole:
    the line names it (before, Ctrl-C before the note took the version back,
    its line left in the log)."""
    root = tmp_path / "store"
    hook = "store/log.py|written()|1" if at == "written" else at
    assert _interrupted(root, kind, hook) == ("interrupted", [0])
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified", "candidate"]
    _whole_or_nothing(root)


#: The child: a fine-tune put while another writer holds the store's lock
#: (a gc deleting a large version, a process stopped while it held it), and
#: Ctrl-C sent to the calling thread once the put waits for that lock; then
#: the lock is let go, and what is left is printed.
_INTERRUPTED_AT_THE_LOCK = """
import fcntl, os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # see CTRL_C_RAISES
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


#: The child: on a fresh copy of a dedup store each time, a put (argv[2]:
#: "new" bytes or a "fine-tune" of a verified load) sent Ctrl-C at its Nth
#: place where a signal's handler can run on the calling thread (a
#: function's entry, a C function's return: sys.setprofile's "call" and
#: "c_return"), for N = 1, 1 + STRIDE (argv[3]), ... until the put ran to
#: its end. Checked at once, while the process lives: the versions are
#: those the log's lines name, none is left `writing`, no temp file is left
#: in `tensors/` or a version's directory, no version is left half removed,
#: a candidate verifies, gc then keeps only objects a manifest names, and a
#: later put works (no lock left held). A line for each place where one
#: failed, then "done RUNS".
_EVERY_PLACE = """
import faulthandler, json, os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # see CTRL_C_RAISES
import numpy as np
from treeguard import ArtifactStore
top, kind, stride = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = {"a": np.ones(1000, np.float32), "b": np.ones(10, np.float32), "c": np.zeros(5, np.float32)}
store = ArtifactStore.init(os.path.join(top, "base"), dedup=True)
v = store.put(base)
store.verify(v)
store.promote(v)
def ctrl_c_at(n, where):
    seen = [0]
    def hook(frame, event, arg):
        if event in ("call", "c_return"):
            seen[0] += 1
            if seen[0] == n:
                sys.setprofile(None)
                name = arg.__name__ if event == "c_return" else frame.f_code.co_name
                where.append(f"{event} {name} {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
                signal.raise_signal(signal.SIGINT)
    return hook
def problems(root, store):
    found, listed = [], store.versions()
    if [i.version for i in listed] != [e.version for e in store.history() if e.action == "put"]:
        found.append("the log and the versions disagree")
    found += [f"{i.version} left {i.status}" for i in listed if i.status == "writing"]
    found += [f"tensors/{p} left" for p in os.listdir(os.path.join(root, "tensors")) if p[0] == "."]
    versions = os.path.join(root, "versions")
    for d in os.listdir(versions):
        found += [f"{d} half removed"] if d[0] == "." else [
            f"{d}/{p} left" for p in os.listdir(os.path.join(versions, d)) if p[0] == "."]
    for i in listed:
        if i.status == "candidate" and store.verify(i.version).status != "verified":
            found.append(f"{i.version} does not verify")
    store.gc()
    named = set()
    for i in [i for i in store.versions() if i.status != "writing"]:
        with open(os.path.join(versions, i.version, "tensors.json")) as f:
            named |= set(json.load(f)["objects"])
    held = {p for p in os.listdir(os.path.join(root, "tensors")) if p[0] != "."}
    found += [f"gc left {p}" for p in held - named]
    later = store.put({k: x * 3 for k, x in base.items()})
    found += [] if store.verify(later).status == "verified" else ["a later put does not verify"]
    return found
n, runs = 1, 0
while True:
    root = os.path.join(top, "store")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(os.path.join(top, "base"), root)
    store = ArtifactStore(root)
    if kind == "fine-tune":
        tree = store.load_current(base)
        tree = {**tree, "a": tree["a"] + 2, "c": tree["c"] + 3}
    else:
        tree = {k: x + 1 for k, x in base.items()}
    faulthandler.dump_traceback_later(60, exit=True)  # a put or a later one that hangs
    where = []
    sys.setprofile(ctrl_c_at(n, where))
    try:
        store.put(tree)
    except KeyboardInterrupt:
        pass
    finally:
        sys.setprofile(None)
    runs += 1
    for problem in problems(root, store):
        print(n, *where, problem, flush=True)
    if not where:
        break
    n += stride
print("done", runs, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["new", "fine-tune"])
@pytest.mark.parametrize(
    "stride",
    [7, pytest.param(1, marks=[pytest.mark.reliability, pytest.mark.long(110)], id="every")],
)
def test_a_put_interrupted_wherever_a_signal_can_land_leaves_it_whole_or_nothing(
    tmp_path: Path, kind: str, stride: int
) -> None:
    """Ctrl-C at each place a signal's handler can run on the put's calling
    thread (every 7th in the slow run, each of about 2,000 in the
    reliability run): each put leaves its version whole or nothing of it,
    at once. Before, 116 of the 2,173 places of both kinds failed: 75 left
    a ``writing`` version, a temp file, or a version removed whose log's
    line stayed, and 41 a lock held (the put or a later one waited
    forever), among them Ctrl-C just after ``Future.result`` took the
    future's lock."""
    done = run_python(_EVERY_PLACE, str(tmp_path), kind, str(stride), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    *failed, last = done.stdout.splitlines()
    assert failed == []
    runs = int(last.split()[1])
    assert runs * stride > 1500  # each put has about 2,000 such places
