"""A dedup store's put runs on threads kept between puts: puts one after
another share one pool's threads, puts at once all finish and leave few idle
threads kept, and a forked child puts with threads of its own."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.subproc import run_python
from treeguard import ArtifactStore


def _tree(fill: float) -> dict[str, Any]:
    return {"body": {f"l{i}": np.full((16, 8), fill + i, np.float32) for i in range(3)}}


def _put_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("treeguard-put")]


def test_puts_one_after_another_share_the_threads_of_one_pool(tmp_path: Path) -> None:
    store = ArtifactStore.init(tmp_path / "s", dedup=True)
    seen: dict[int, threading.Thread] = {}  # held, so no thread's id is reused meanwhile
    for fill in range(0, 60, 10):
        store.put(_tree(fill))
        kept = _put_threads()
        assert kept  # kept for the next put
        seen.update((id(t), t) for t in kept)
    assert len(seen) <= 4  # one pool's threads: a put's three and the reservation's


def test_puts_at_once_each_finish_and_few_threads_are_kept(tmp_path: Path) -> None:
    store = ArtifactStore.init(tmp_path / "s", dedup=True)
    store.put(_tree(0))
    start = threading.Barrier(6)
    names: dict[float, str] = {}

    def put(fill: float) -> None:
        start.wait(timeout=60)
        names[fill] = store.put(_tree(fill))

    threads = [threading.Thread(target=put, args=(float(f),)) for f in range(100, 700, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)  # a safety stop: puts that shared one pool could wait on each other
    assert not [t for t in threads if t.is_alive()]
    # counted as the last put returns: a pool not kept has ended its threads by then
    assert len(_put_threads()) <= 8  # two idle pools of four threads at most
    for fill, version in names.items():
        store.verify(version)
        store.promote(version)
        got = store.load_current(_tree(0))
        np.testing.assert_array_equal(got["body"]["l2"], _tree(fill)["body"]["l2"])
    assert len(names) == 6


FORKED = """
import os, sys, time
import numpy as np
from treeguard import ArtifactStore
store = ArtifactStore.init(sys.argv[1], dedup=True)
for i in range(5):  # the parent's threads, kept, each idle again after each task
    store.put({"w": np.full(4, i, np.float32)})
pid = os.fork()
if pid == 0:
    os._exit(0 if store.put({"w": np.zeros(4, np.float32)}) else 3)
for _ in range(600):  # a safety stop: a child given its parent's pool waits forever
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    print("child hung")
"""


@pytest.mark.slow  # a child interpreter: about 2 s
def test_a_forked_child_puts_with_threads_of_its_own(tmp_path: Path) -> None:
    res = run_python(FORKED, str(tmp_path / "s"), env={"PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["child", "0"], res.stdout
    assert len(ArtifactStore(tmp_path / "s").versions()) == 6
