"""Two real processes with ``jax.distributed`` on 127.0.0.1 (gloo CPU
collectives, two devices each), started and ended by the tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import obstore
import pytest
from obstore.store import S3Store
from ports import free_port
from shardtools import MANIFEST_NAME, read
from subproc import start_python, stop

import treeguard

HERE = Path(__file__).parent
WORKER = (HERE / "worker.py").read_text()
TWO = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def _start(directory: Path | str, mode: str) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    env = {**TWO, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return [start_python(WORKER, str(pid), port, str(directory), mode, env=env) for pid in range(2)]


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The child's stdout lines, read by a thread, so a wait has a timeout."""
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue[str], word: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {word} within {timeout} s")
        try:
            if q.get(timeout=left).startswith(word):
                return
        except queue.Empty:
            continue


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    directory = tmp_path_factory.mktemp("multihost") / "ckpt"
    procs = _start(directory, "suite")
    outs = []
    try:
        for p in procs:
            out, err = stop(p, timeout=150)
            assert p.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                stop(p)
    yield outs


@pytest.mark.slow
def test_restore_onto_another_mesh_is_bit_exact(suite: list[str]) -> None:
    for out in suite:
        assert "RESTORED True" in out, out


@pytest.mark.slow
def test_a_renamed_layer_fails_in_every_process_before_any_read(suite: list[str]) -> None:
    for out in suite:
        assert (
            "MISMATCH ['dense_1']: missing: dict of 2 leaves (f32[64], f32[32,64]) in `like`, "
            "absent in the checkpoint"
        ) in out, out


@pytest.mark.slow
def test_a_flipped_byte_fails_in_every_process_naming_the_array(suite: list[str]) -> None:
    for out in suite:
        assert "INTEGRITY ['dense1']['w']" in out, out


@pytest.mark.slow
def test_each_process_reads_only_the_shards_its_own_shards_need(suite: list[str]) -> None:
    for out in suite:
        assert "ROWS True" in out, out
    # process 1 never touched the shard it does not need: it names process 0's failure
    assert "CUT ['dense1']['w'] the stored arrays ['dense1']['w'] could not be read" in suite[0]
    assert (
        "CUT ['dense1']['w'] process 0 could not read the stored arrays ['dense1']['w']" in suite[1]
    ), suite[1]


def _writing(directory: Path) -> bool:
    """Whether orbax's temporary directory of a new save is there: the save
    has started to write its arrays, and not yet renamed them into place."""
    return any(".orbax-checkpoint-tmp" in n for n in os.listdir(directory))


def _kill_mid_save(directory: Path, delay: float, victim: int = 1) -> int:
    """Starts a job that saves version 1 then version 2, SIGKILLs process
    ``victim`` ``delay`` seconds after version 2's arrays start to be written,
    then ends the other; returns the version the directory holds afterwards,
    after loading it verified."""
    procs = _start(directory, "kill")
    try:
        lines = [_lines(p) for p in procs]
        _wait_for(lines[1], "SAVING2", timeout=150)
        deadline = time.monotonic() + 60
        while not _writing(directory):
            assert time.monotonic() < deadline, "the second save never started writing"
            time.sleep(0.002)
        time.sleep(delay)
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(timeout=30)
        time.sleep(0.2)
        procs[1 - victim].kill()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
    version = int(read(directory)["metadata"]["version"])
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    rng = np.random.default_rng(version)
    rows = 1 << 15
    expect = {
        "dense1": {
            "w": rng.standard_normal((rows, 64)).astype(np.float32),
            "b": rng.standard_normal(64).astype(np.float32),
        },
        "embed": rng.integers(-100, 100, (8, 64)).astype(np.int8),
    }
    like = jax.tree.map(lambda h: jax.ShapeDtypeStruct(h.shape, h.dtype, sharding=one), expect)
    out = treeguard.load_sharded(directory, like)
    for a, h in zip(jax.tree.leaves(out), jax.tree.leaves(expect)):
        assert np.asarray(a).tobytes() == h.tobytes()
    return version


@pytest.mark.slow
def test_sigkill_of_one_process_mid_save_leaves_the_previous_version(tmp_path: Path) -> None:
    assert _kill_mid_save(tmp_path / "ckpt", delay=0.0) == 1


@pytest.mark.reliability
@pytest.mark.parametrize(("victim", "delay"), [(1, 0.2), (1, 1.0), (0, 0.05), (0, 0.5)])
def test_sigkill_at_any_moment_leaves_a_whole_version(
    tmp_path: Path, victim: int, delay: float
) -> None:
    assert _kill_mid_save(tmp_path / "ckpt", delay=delay, victim=victim) in (1, 2)


def _two_process_store(root: str) -> None:
    """Both processes put, verify onto another mesh, promote (process 0),
    load the current version, and agree on a verdict one process rejects."""
    procs = _start(root, "store")
    outs = []
    try:
        for p in procs:
            out, err = stop(p, timeout=150)
            assert p.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                stop(p)
    for out in outs:
        assert "PUT v000001 candidate sharded" in out, out
        assert "VERIFIED verified" in out
        assert "CURRENT v000001 True" in out
        assert "AGREED v000002 rejected check first returned False" in out, out
    store = treeguard.ArtifactStore(root)
    assert [(v.version, v.status) for v in store.versions()] == [
        ("v000001", "verified"),
        ("v000002", "rejected"),
    ]
    assert [e.action for e in store.history()].count("verify") == 2


@pytest.mark.slow
def test_sharded_store_versions_across_two_processes(tmp_path: Path) -> None:
    _two_process_store(str(tmp_path / "store"))


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_sharded_store_versions_across_two_processes_in_a_bucket(s3_url: str) -> None:
    treeguard.ArtifactStore.init(s3_url)
    _two_process_store(s3_url)
    _, rest = s3_url.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    raw = obstore.get(S3Store(bucket, prefix=prefix), f"versions/v000001/{MANIFEST_NAME}")
    manifest = json.loads(bytes(raw.bytes()))
    writers = {s["process"] for a in manifest["arrays"] for s in a["shards"]}
    assert writers == {0, 1}  # each process wrote its own shard objects
