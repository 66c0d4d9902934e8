"""Concurrent gc, promote, rollback and put against one store, checked
against a model after every round (both kinds of store go through it).

Four worker processes (a putter that also verifies, a promoter, a
roller-back and a collector) each get one operation per round, all sent at
once; with a delaying proxy in front of a bucket their requests interleave.
After each round the store must match the model: exactly the versions whose
put returned and that no gc reported removing are held; the current version
and the previous verified one load through every gate; the version put this
round is held; every failure is a typed treeguard error, and gc never finds
a pointer naming a version that is gone.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Mapping
from typing import Any

from tests.subproc import start_python, stop
from treeguard import ArtifactStore

#: A worker: ROOT as its argument; one JSON operation a line on stdin, one
#: JSON answer a line on stdout (``ok``, or the error's class and first line).
WORKER = """
import json, sys, traceback
import numpy as np
from treeguard import ArtifactStore, RetentionPolicy, TreeguardError
store = ArtifactStore(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    op = json.loads(line)
    try:
        if op["op"] == "put":
            tree = {"w": np.full((16, 16), op["w"], np.float32)}
            if op["shared"]:  # a dedup store: every version shares "b", some share "w"
                tree["b"] = np.ones(64, np.float32)
            out = store.put(tree, metadata=op)
            try:
                status = store.verify(out).status
                if op["promote"] and status == "verified":
                    store.promote(out)  # its own version, beside a gc that listed it under way
            except TreeguardError as e:
                status = type(e).__name__
            out = [out, status]
        elif op["op"] == "promote":
            out = store.promote(op["v"])
        elif op["op"] == "rollback":
            out = store.rollback()
        else:
            out = store.gc(policy=RetentionPolicy(keep_last=op["keep"]))
        print(json.dumps({"ok": out}), flush=True)
    except TreeguardError as e:
        print(json.dumps({"error": type(e).__name__, "why": str(e).splitlines()[0]}), flush=True)
    except Exception:
        print(json.dumps({"untyped": traceback.format_exc()}), flush=True)
"""

ROLES = ("put", "promote", "rollback", "gc")
#: The errors each operation may end with when another one raced it.
EXPECTED = {
    "put": {"StoreError"},  # its name retired by gc while it was put
    "promote": {
        "ConflictError",
        "RetiredVersionError",
        "UnknownVersionError",
        "IntegrityError",
        "StoreError",
    },
    "rollback": {"ConflictError", "StoreError"},
    "gc": {"StoreError"},  # the pointer kept moving
}


class Races:
    """The workers and the model of one store.

    Args:
      root: the store (made here).
      env: the environment of the workers (a bucket's client settings).
      seed: the seed of the choices of versions to promote.
      dedup: make the store with ``dedup=True``: each put shares one
        tensor with every other and its other with every third, and each
        round loads every version held, every byte checked (gc never
        deletes a tensor a version refers to).
    """

    def __init__(
        self,
        root: str,
        env: Mapping[str, str] | None = None,
        seed: int = 0,
        *,
        storage_errors: bool = False,
        dedup: bool = False,
    ) -> None:
        self.root = root
        self.dedup = dedup
        #: whether a StorageError is an expected end (a server that lies)
        self.storage_errors = storage_errors
        self.store = ArtifactStore.init(root, dedup=dedup)
        self.rng = random.Random(seed)
        self.held: list[str] = []  # the model: put returned, no gc removed it (put order)
        self.verified: list[str] = []
        self.errors: dict[str, int] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.workers = {
            r: start_python(WORKER, root, env=dict(env or {}), stdin=True) for r in ROLES
        }
        for role, proc in self.workers.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "ready", (role, line, stop(proc)[1][-2000:])

    def run(self, rounds: int) -> dict[str, int]:
        """``rounds`` rounds, then the workers stopped; how many of each
        typed failure the operations met."""
        try:
            for i in range(rounds):
                self.round(i)
            return self.errors
        finally:
            self.close()

    def close(self) -> None:
        for proc in self.workers.values():
            stop(proc)  # closes its stdin: the worker's loop ends

    def _ask(self, ops: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for role, op in ops.items():
            stdin = self.workers[role].stdin
            assert stdin is not None
            stdin.write(json.dumps(op) + "\n")
            stdin.flush()
        answers = {}
        for role in ops:
            proc: subprocess.Popen[str] = self.workers[role]
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, (role, stop(proc)[1][-3000:])
            answers[role] = json.loads(line)
        return answers

    def round(self, i: int, *, keep: int = 1) -> None:
        """One round of the four operations at once, then the checks."""
        recent = self.verified[-3:]
        pool = self.verified if self.rng.random() < 0.3 else recent
        target = self.rng.choice(pool) if pool else "v000001"
        ops = {
            "put": {
                "op": "put",
                "i": i,
                "w": i % 3 if self.dedup else i,
                "shared": self.dedup,
                "promote": i % 2 == 1,
            },
            "promote": {"op": "promote", "v": target},
            "rollback": {"op": "rollback"},
            "gc": {"op": "gc", "keep": keep},
        }
        answers = self._ask(ops)
        for role, got in answers.items():
            assert "untyped" not in got, (role, got["untyped"])
            if "error" in got:
                expected = EXPECTED[role] | ({"StorageError"} if self.storage_errors else set())
                assert got["error"] in expected, (i, role, got)
                self.errors[got["error"]] = self.errors.get(got["error"], 0) + 1
        removed = answers["gc"].get("ok") or []
        put = answers["put"].get("ok")
        if answers["put"].get("error") == "StorageError":  # a failed put may have made it
            made = [v for v in self.store.versions() if v.metadata.get("i") == i]
            put = [made[0].version, made[0].status] if made else None
        if put is not None:
            assert put[0] not in removed, (i, "gc removed the version put beside it", put)
            self.held.append(put[0])
            if put[1] == "verified":
                self.verified.append(put[0])
            elif put[1] != "ConflictError":  # a promote that lost to another is no failure
                assert put[1] in EXPECTED["promote"] | {"StorageError"}, (i, put)
        self.held = [v for v in self.held if v not in removed]
        self.verified = [v for v in self.verified if v not in removed]
        self.last = answers
        self.check(i, put[0] if put else None)

    def check(self, i: int, put: str | None) -> None:
        store = self.store
        listed = {v.version for v in store.versions()}
        assert listed == set(self.held), (i, sorted(listed ^ set(self.held)), self.last)
        current, previous = store.current(), store.previous()
        if current is not None:
            assert current in listed, (i, "current", current)
            assert store.load_current()["w"].shape == (16, 16)
        if previous is not None:
            assert previous in listed, (i, "previous", previous)
            assert store.load_verified(previous)["w"].shape == (16, 16)
        if put is not None:
            assert put in listed, (i, "put", put)
        if self.dedup:  # every tensor of every version held is there, and whole
            for v in sorted(listed):
                assert store.load_version(v)["b"].shape == (64,), (i, v)
            if os.path.isdir(self.root):  # a local gc, alone under the lock, clears its marks
                marked = set(os.listdir(os.path.join(self.root, "doomed")))
                held = set(os.listdir(os.path.join(self.root, "tensors")))
                assert not marked & held, (i, "an object kept is still marked", marked & held)
