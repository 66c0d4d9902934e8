"""Reliability with real processes and real files: SIGKILL during saves and
store updates, random corruption, concurrent savers and promoters.

The counts are small by default so the suite stays fast; ``make reliability``
(``TREEGUARD_RELIABILITY=1``) runs the full counts the issue asks for.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest

from treeguard import (
    ArtifactStore,
    FormatError,
    IntegrityError,
    RetentionPolicy,
    load,
    read_header,
    save,
    verify_file,
)

POINTER_FILE = "CURRENT.json"

pytestmark = pytest.mark.reliability

FULL = os.environ.get("TREEGUARD_RELIABILITY") == "1"
KILLS = 40 if FULL else 6
STORE_KILLS = 30 if FULL else 4
FLIPS = 5000 if FULL else 200
CUTS = 1000 if FULL else 60
ROOT = str(Path(__file__).resolve().parents[2])

_SAVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from treeguard import save
    path, tag = sys.argv[1], int(sys.argv[2])
    tree = {f"l{i:02d}": np.full((512, 1024), tag * 100 + i, np.float32) for i in range(32)}
    print("ready", flush=True)
    save(path, tree, metadata={"tag": tag})
    print("done", flush=True)
    """
)

_STORE_WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from treeguard import ArtifactStore, RetentionPolicy
    root, tag = sys.argv[1], int(sys.argv[2])
    tree = {f"l{i:02d}": np.full((256, 1024), tag * 100 + i, np.float32) for i in range(32)}
    store = ArtifactStore(root)
    print("ready", flush=True)
    v = store.put(tree, metadata={"tag": tag})
    store.verify(v, checks=[lambda t: bool(np.isfinite(t["l00"]).all())])
    store.promote(v)
    store.gc(policy=RetentionPolicy(keep_last=2))
    print("done", flush=True)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
    return proc


def _timed_run(script: str, *args: str) -> float:
    proc = _start(script, *args)
    t0 = time.perf_counter()
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "done", proc.stderr.read() if proc.stderr else ""
    duration = time.perf_counter() - t0
    proc.wait(timeout=60)
    _close(proc)
    return duration


def _close(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _kill_at(proc: subprocess.Popen[str], delay: float) -> None:
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    _close(proc)


def _tag_of(tree: dict[str, Any]) -> int:
    tags = {int(tree[k].flat[0]) // 100 for k in tree}
    assert len(tags) == 1, f"mixed file: {tags}"
    tag = tags.pop()
    for i, k in enumerate(sorted(tree)):
        assert np.all(tree[k] == tag * 100 + i), k
    return tag


def test_reliability_sigkill_during_save_keeps_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    duration = _timed_run(_SAVER, str(path), "0")  # tag 0 is the file in place
    assert _tag_of(load(path)) == 0
    rng = random.Random(1234)
    moments = sorted(rng.uniform(0, duration * 1.05) for _ in range(KILLS))
    rng.shuffle(moments)
    current = 0
    outcomes = {"old": 0, "new": 0}
    for i, delay in enumerate(moments, start=1):
        proc = _start(_SAVER, str(path), str(i))
        _kill_at(proc, delay)
        tree = load(path)  # must always load and verify
        verify_file(path)
        tag = _tag_of(tree)
        assert tag in (current, i), (tag, current, i)
        assert read_header(path).metadata == {"tag": tag}
        outcomes["new" if tag == i else "old"] += 1
        current = tag
    # Temps of the killed savers never block a save, and the next save removes them.
    save(path, {"w": np.ones(1, np.float32)})
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    assert sum(outcomes.values()) == KILLS


def test_reliability_sigkill_during_store_update_keeps_current(tmp_path: Path) -> None:
    root = tmp_path / "store"
    duration = _timed_run(_STORE_WORKER, str(root), "0")
    store = ArtifactStore(root)
    like = {f"l{i:02d}": np.zeros((256, 1024), np.float32) for i in range(32)}
    assert _tag_of(store.load_current(like)) == 0
    rng = random.Random(99)
    for i in range(1, STORE_KILLS + 1):
        before = store.current()
        proc = _start(_STORE_WORKER, str(root), str(i))
        _kill_at(proc, rng.uniform(0, duration * 1.05))
        now = store.current()
        assert now is not None
        tag = _tag_of(store.load_current(like))
        assert store.info(now).status == "verified"
        assert now == before or store.info(now).metadata == {"tag": i}
        assert tag == store.info(now).metadata["tag"]
        json.loads((root / POINTER_FILE).read_text())
        # Every status file still reads: a kill never leaves a torn status.json.
        assert [v.version for v in store.versions() if v.status == "unreadable"] == []
    assert store.history()
    store.gc(policy=RetentionPolicy(keep_last=1))
    assert store.current() in [v.version for v in store.versions()]


def _medium_tree() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "emb": rng.standard_normal((64, 32)).astype(np.float32),
        "layers": [
            {"w": rng.standard_normal((32, 32)).astype(ml_dtypes.bfloat16), "b": np.zeros(32)}
            for _ in range(6)
        ],
        "scale": np.float32(0.5),
        "q": rng.integers(-8, 8, (128,)).astype(np.int8),
        "f8": rng.standard_normal(16).astype(ml_dtypes.float8_e4m3fn),
    }


def test_reliability_random_flips_and_truncations_are_detected(tmp_path: Path) -> None:
    path = tmp_path / "good.safetensors"
    tree = _medium_tree()
    save(path, tree, metadata={"note": "corruption target"})
    raw = path.read_bytes()
    header_end = 8 + int.from_bytes(raw[:8], "little")
    ref = [np.asarray(x).tobytes() for x in jax.tree.leaves(load(path, like=tree))]
    bad = tmp_path / "bad.safetensors"
    rng = random.Random(2024)
    caught = harmless = 0
    for _ in range(FLIPS):
        i = rng.randrange(len(raw))
        data = bytearray(raw)
        data[i] ^= rng.randrange(1, 256)
        bad.write_bytes(bytes(data))
        try:
            out = load(bad, like=tree)
        except (FormatError, IntegrityError):
            caught += 1
            continue
        harmless += 1
        assert 8 <= i < header_end and raw[i : i + 1] == b" ", f"undetected flip at byte {i}"
        assert [np.asarray(x).tobytes() for x in jax.tree.leaves(out)] == ref
    for _ in range(CUTS):
        n = rng.randrange(len(raw))
        bad.write_bytes(raw[:n])
        with pytest.raises(FormatError):
            load(bad, like=tree)
    assert caught + harmless == FLIPS and caught >= FLIPS * 0.9


_CONCURRENT_SAVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from treeguard import save
    path, tag, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tree = {f"l{i:02d}": np.full((128, 1024), tag * 100 + i, np.float32) for i in range(16)}
    print("ready", flush=True)
    for _ in range(n):
        save(path, tree, metadata={"tag": tag})
    print("done", flush=True)
    """
)


def test_reliability_concurrent_savers_never_mix(tmp_path: Path) -> None:
    path = tmp_path / "shared.safetensors"
    n = 30 if FULL else 8
    procs = [_start(_CONCURRENT_SAVER, str(path), str(tag), str(n)) for tag in (1, 2)]
    seen = {1: 0, 2: 0}
    while any(p.poll() is None for p in procs):
        if path.exists():
            seen[_tag_of(load(path))] += 1
    for p in procs:
        assert p.wait(timeout=60) == 0
        _close(p)
    assert _tag_of(load(path)) in (1, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["shared.safetensors"]


_PROMOTER = textwrap.dedent(
    """
    import sys
    from treeguard import ArtifactStore, RetentionPolicy
    store = ArtifactStore(sys.argv[1])
    names = sys.argv[2].split(",")
    print("ready", flush=True)
    for name in names:
        store.promote(name)
    print("done", flush=True)
    """
)


def test_reliability_two_processes_promoting_at_once(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    n = 25 if FULL else 8
    tree = {"w": np.ones(4, np.float32)}
    names = {side: [f"{side}{i:02d}" for i in range(n)] for side in ("a", "b")}
    for side_names in names.values():
        for name in side_names:
            store.put(tree, version=name)
            assert store.verify(name).status == "verified"
    procs = [_start(_PROMOTER, str(tmp_path), ",".join(names[side])) for side in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
        _close(p)
    pointer = json.loads((tmp_path / POINTER_FILE).read_text())
    stack = [pointer["current"], *pointer["previous"]]
    promotes = [e for e in store.history() if e.action == "promote"]
    assert len(promotes) == 2 * n
    # No lost update: the pointer is exactly the most recent promotions, newest first,
    # each once, as deep as the pointer remembers (16 former versions).
    assert stack == [e.version for e in reversed(promotes)][:17]
    assert pointer["current"] in (names["a"][-1], names["b"][-1])
    assert store.rollback() in stack[1:2]


_CHURN = textwrap.dedent(
    """
    import random, sys
    import numpy as np
    from treeguard import ArtifactStore, IntegrityError, RetentionPolicy, StoreError
    root, worker, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = ArtifactStore(root)
    rng = random.Random(worker)
    print("ready", flush=True)
    for r in range(rounds):
        tag = worker * 1000 + r
        tree = {"w": np.full((64, 64), tag, np.float32), "b": np.zeros(64, np.float32)}
        v = store.put(tree, metadata={"tag": tag})
        try:
            store.verify(v, checks=[lambda t: bool(np.isfinite(t["w"]).all())])
            if rng.random() < 0.5:
                store.promote(v)
        except (StoreError, IntegrityError):
            pass  # removed by another worker's gc, or replaced: refused, never mis-filed
        if rng.random() < 0.4:
            store.gc(policy=RetentionPolicy(keep_last=1))
        if rng.random() < 0.2:
            try:
                store.rollback()
            except StoreError:
                pass
    print("done", flush=True)
    """
)


def test_reliability_concurrent_put_verify_gc_never_misfiles_a_verdict(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root)
    rounds = 30 if FULL else 8
    procs = [_start(_CHURN, str(root), str(w), str(rounds)) for w in range(3)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
        _close(p)
    names = [e.version for e in store.history() if e.action == "put"]
    assert len(names) == len(set(names)) == 3 * rounds  # no name handed out twice
    for info in store.versions():
        if info.status != "verified":
            continue
        header = read_header(info.path)
        # The verdict is about the file that is there, and about the model that was put.
        assert info.digest == header.digest, info.version
        assert header.metadata == info.metadata, info.version
    cur = store.current()
    if cur is not None:
        tag = store.info(cur).metadata["tag"]
        assert float(store.load_current()["w"][0, 0]) == tag
