"""The kill storm both kinds of store go through: a writer process that
puts, verifies, promotes, rolls back and collects garbage in a loop,
SIGKILLed at random moments, with the store checked after each kill."""

from __future__ import annotations

import random
import signal
import subprocess
from collections.abc import Callable

from tests.subproc import child_env, start_python, stop

#: The writer: ROOT as its argument; it prints each promote it saw return,
#: and "rolling back" before each rollback.
WRITER = """
import sys
import numpy as np
from treeguard import ArtifactStore, RetentionPolicy
store = ArtifactStore(sys.argv[1])
print("ready", flush=True)
for i in range(200):
    v = store.put({"w": np.full((64, 64), float(i), np.float32)}, metadata={"i": i})
    store.verify(v)
    store.promote(v)
    print("promoted", v, flush=True)
    if i % 3 == 2:
        print("rolling back", flush=True)
        store.rollback()
    if i % 4 == 3:
        store.gc(policy=RetentionPolicy(keep_last=2))
"""


def storm(root: str, check: Callable[[str], None], *, runs: int = 40, longest: float = 1.5) -> int:
    """Starts the writer ``runs`` times on ``root``, kills each at a random
    moment up to ``longest`` seconds after it is ready, and calls ``check``
    with what it printed after each run; returns how many were killed."""
    rng = random.Random(20261203)
    kills = 0
    for _ in range(runs):
        proc = start_python(WRITER, root, env=child_env())
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            try:
                proc.wait(timeout=rng.uniform(0.05, longest))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        finally:
            printed, _ = stop(proc)
        check(printed)
    return kills
