"""Digests: BLAKE3 for what is written now, sha256 files written before it
(committed under tests/data/legacy) still loaded and verified, mixed stores,
a flipped byte found in any chunk by both algorithms, and no hashing thread
left behind by a failed load."""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import blake3
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import treeguard as tg
from treeguard._cli.main import main

# The hashing engine on purpose: its spans, ranges and threads against a plain hashlib.
from treeguard._src import hashing  # _src: the hashing engine

LEGACY = Path(__file__).parents[1] / "data" / "legacy"
KEY = "legacy-fixture-key-0123456789abcdef"
ALGORITHMS = ["blake3", "sha256"]


def _reference(data: bytes, algorithm: str) -> str:
    """The digest by the reference implementations, not by the engine."""
    if algorithm == "blake3":
        return str(blake3.blake3(data).hexdigest())
    return hashlib.sha256(data).hexdigest()


def _legacy_params() -> dict[str, Any]:
    """The tree the legacy files hold (make_legacy.py)."""
    return {
        "dense1": {
            "w": np.arange(24, dtype=np.float32).reshape(4, 6) / 7,
            "b": np.zeros(6, np.float32),
        },
        "dense2": {
            "w": (np.arange(12, dtype=np.float32).reshape(6, 2) - 5).astype(jnp.bfloat16),
            "b": np.ones(2, np.int8),
        },
        "step": np.int64(7),
    }


def _copy(name: str, tmp_path: Path) -> Path:
    src = LEGACY / name
    dst = tmp_path / name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    return dst


def _hash_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(hashing.THREAD_PREFIX)]


def _assert_trees_equal(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# -- the engine ------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_engine_agrees_with_the_reference_implementations(algorithm: str) -> None:
    data = np.random.default_rng(0).bytes(3 * 1024 * 1024 + 17)
    assert hashing.digest(data, algorithm) == _reference(data, algorithm)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6),
    chunk=st.integers(1, 70),
    algorithm=st.sampled_from(ALGORITHMS),
    data=st.data(),
)
@pytest.mark.slow
def test_any_chunk_size_gives_the_digest_of_the_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    chunk: int,
    algorithm: Any,
    data: st.DataObject,
) -> None:
    blob = bytes(data.draw(st.binary(min_size=sum(sizes) + 8, max_size=sum(sizes) + 8)))
    path = tmp_path_factory.mktemp("h") / "f"
    path.write_bytes(blob)
    offsets = [8 + sum(sizes[:i]) for i in range(len(sizes))]
    want = [_reference(blob[o : o + n], algorithm) for o, n in zip(offsets, sizes)]
    fd = os.open(path, os.O_RDONLY)
    try:
        for readers in (1, 3):  # the calling thread alone, and reader threads
            bufs = [bytearray(n) for n in sizes]
            spans = [hashing.Span(o, memoryview(b), w) for o, b, w in zip(offsets, bufs, want)]
            assert hashing.read_spans(fd, spans, algorithm, chunk=chunk, readers=readers) == want
            assert [bytes(b) for b in bufs] == [blob[o : o + n] for o, n in zip(offsets, sizes)]
        got = hashing.hash_ranges(fd, list(zip(offsets, sizes)), algorithm, chunk=chunk)
        assert got == want
        assert hashing.hash_file(fd, algorithm, chunk=chunk) == _reference(blob, algorithm)
    finally:
        os.close(fd)
    out = os.open(tmp_path_factory.mktemp("w") / "g", os.O_WRONLY | os.O_CREAT)
    try:
        views = [memoryview(blob[o : o + n]) for o, n in zip(offsets, sizes)]
        assert hashing.write_hashed(out, views, algorithm, chunk=chunk) == want
    finally:
        os.close(out)
    dest = memoryview(bytearray(sum(sizes)))
    assert hashing.copy_hashed(dest, views, algorithm, chunk=chunk) == want
    assert bytes(dest) == blob[8:]
    source = hashing.BytesReader(blob)
    assert hashing.hash_ranges(source, list(zip(offsets, sizes)), algorithm, chunk=chunk) == want
    assert not _hash_threads()


def test_prefaulting_memory_never_changes_its_bytes() -> None:
    """Readers fault in a chunk's pages before reading into it: the bytes
    already there (a page shared with the chunk before) stay as they were."""
    page = mmap.PAGESIZE
    held = np.random.default_rng(1).bytes(5 * page + 123)
    buf = bytearray(held)
    hashing.prefault(memoryview(buf)[7 : 4 * page + 9])
    hashing.prefault(memoryview(buf))
    assert bytes(buf) == held
    mapped = mmap.mmap(-1, 4 * page)
    mapped[:4] = b"tree"
    hashing.prefault(memoryview(mapped)[1:])
    assert mapped[:5] == b"tree\x00"
    hashing.prefault(memoryview(held))  # read-only: left alone
    mapped.close()


def test_a_copy_that_does_not_fill_its_destination_exactly_is_refused() -> None:
    views = [memoryview(b"abc"), memoryview(b"de")]
    with pytest.raises(ValueError, match="the buffers hold more than the 4 bytes of dest"):
        hashing.copy_hashed(memoryview(bytearray(4)), views, "blake3")
    with pytest.raises(ValueError, match="the buffers hold 5 bytes, dest 6"):
        hashing.copy_hashed(memoryview(bytearray(6)), views, "blake3")
    assert not _hash_threads()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("where", ["first", "middle", "last", "boundary-1", "boundary"])
def test_a_flipped_byte_in_any_chunk_is_found(tmp_path: Path, algorithm: str, where: str) -> None:
    chunk = 64
    blob = bytearray(np.random.default_rng(1).bytes(5 * chunk + 9))
    at = {
        "first": 0,
        "middle": len(blob) // 2,
        "last": len(blob) - 1,
        "boundary-1": 2 * chunk - 1,
        "boundary": 2 * chunk,
    }[where]
    good = _reference(bytes(blob), algorithm)
    blob[at] ^= 0x01
    path = tmp_path / "f"
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        span = hashing.Span(0, memoryview(bytearray(len(blob))), good)
        found = hashing.read_spans(fd, [span], algorithm, chunk=chunk)  # type: ignore[arg-type]
        assert hashing.mismatched([span], found) == [0]
        assert hashing.hash_ranges(fd, [(0, len(blob))], algorithm, chunk=chunk) != [good]  # type: ignore[arg-type]
    finally:
        os.close(fd)


def test_an_unknown_algorithm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    with pytest.raises(ValueError, match="digest must be one of 'blake3', 'sha256', got 'md5'"):
        tg.save(path, {"w": np.ones(2)}, digest="md5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="digest must be one of"):
        tg.ArtifactStore(tmp_path / "s").put({"w": np.ones(2)}, digest="sha1")  # type: ignore[arg-type]
    assert not path.exists() and not list((tmp_path / "s" / "versions").glob("v*"))


# -- checkpoints -----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("where", ["first", "middle", "last", "boundary-1", "boundary"])
def test_a_flipped_byte_in_a_checkpoint_is_found(
    tmp_path: Path, algorithm: Any, where: str
) -> None:
    """A tensor of three chunks and a bit: a flip in any of them, and on
    either side of a chunk boundary, is found by load and verify_file."""
    n = (3 * hashing.CHUNK + 4096) // 4
    tree = {"a": np.ones(3, np.float32), "w": np.arange(n, dtype=np.float32)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree, digest=algorithm)
    h = tg.read_header(path)
    assert h.hash_name == algorithm
    w = h.tensors[1]
    offset = {
        "first": 0,
        "middle": w.nbytes // 2,
        "last": w.nbytes - 1,
        "boundary-1": hashing.CHUNK - 1,
        "boundary": hashing.CHUNK,
    }[where]
    with open(path, "r+b") as f:
        f.seek(h.data_start + w.begin + offset)
        byte = f.read(1)
        f.seek(h.data_start + w.begin + offset)
        f.write(bytes([byte[0] ^ 0x80]))
    text = rf"1 tensor corrupt \({algorithm} mismatch\):\n  \['w'\]: f32\[{n}\]: {algorithm} "
    with pytest.raises(tg.IntegrityError, match=text):
        tg.load(path, like=tree)
    with pytest.raises(tg.IntegrityError, match=text):
        tg.verify_file(path)
    assert not _hash_threads()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_either_algorithm_round_trips_and_stays_safetensors(tmp_path: Path, algorithm: Any) -> None:
    params = _legacy_params()
    path = tmp_path / "p.safetensors"
    tg.save(path, params, digest=algorithm)
    h = tg.verify_file(path, like=params)
    assert h.hash_name == algorithm and h.tensors[0].digest == _reference(
        np.zeros(6, np.float32).tobytes(), algorithm
    )
    _assert_trees_equal(tg.load(path, like=params), params)
    plain = safetensors.numpy.load_file(str(path))
    np.testing.assert_array_equal(plain["['dense1']['w']"], params["dense1"]["w"])


def test_the_default_is_blake3(tmp_path: Path) -> None:
    tg.save(tmp_path / "p.safetensors", {"w": np.ones(2)})
    assert tg.read_header(tmp_path / "p.safetensors").hash_name == "blake3"


def test_a_header_that_names_an_unknown_hash_is_refused(tmp_path: Path) -> None:
    path = _copy("checkpoint.safetensors", tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b'"treeguard.hash":"sha256"', b'"treeguard.hash":"md5___"'))
    with pytest.raises(tg.FormatError, match="unknown tensor hash 'md5___', expected one of"):
        tg.read_header(path)


def test_a_legacy_sha256_checkpoint_loads_and_verifies(tmp_path: Path) -> None:
    path = _copy("checkpoint.safetensors", tmp_path)
    params = _legacy_params()
    h = tg.verify_file(path, like=params)
    assert h.hash_name == "sha256" and h.metadata == {"step": 7}
    assert h.tensors[1].digest == hashlib.sha256(params["dense1"]["w"].tobytes()).hexdigest()
    _assert_trees_equal(tg.load(path, like=params, expect_digest=h.digest), params)
    # a changed byte is still caught, named with the file's own algorithm
    with open(path, "r+b") as f:
        f.seek(h.data_start + h.tensors[1].begin + 5)
        f.write(b"\xff")
    with pytest.raises(tg.IntegrityError, match=r"\['dense1'\]\['w'\]: f32\[4,6\]: sha256"):
        tg.load(path, like=params)


def test_the_cli_names_the_algorithm(tmp_path: Path) -> None:
    legacy = _copy("checkpoint.safetensors", tmp_path)
    new = tmp_path / "new.safetensors"
    tg.save(new, _legacy_params())
    for path, algorithm in ((legacy, "sha256"), (new, "blake3")):
        res = CliRunner().invoke(main, ["ckpt", "verify", str(path)])
        assert res.exit_code == 0, res.output
        assert f"5 tensors, 154 B, every {algorithm} matches" in res.output
        res = CliRunner().invoke(main, ["ckpt", "inspect", str(path)])
        assert res.exit_code == 0 and f"bytes  {algorithm}" in res.output
    sharded = _copy("sharded", tmp_path)
    res = CliRunner().invoke(main, ["ckpt", "verify", str(sharded)])
    assert res.exit_code == 0 and "2 arrays, 9 shards, 144 B, every sha256 matches" in res.output
    res = CliRunner().invoke(main, ["ckpt", "inspect", str(sharded)])
    assert res.exit_code == 0 and "1 process  sha256 " in res.output


# -- no thread outlives a failed load -------------------------------------------


def test_a_failed_load_leaves_no_hashing_thread(tmp_path: Path) -> None:
    tree = {f"w{i}": np.full(4096, i, np.float32) for i in range(12)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree, digest="sha256")  # one worker per core
    h = tg.read_header(path)
    with open(path, "r+b") as f:
        f.seek(h.data_start + h.tensors[3].begin)
        f.write(b"\xff")
    with pytest.raises(tg.IntegrityError, match=r"1 tensor corrupt \(sha256 mismatch\)") as e:
        tg.load(path, like=tree)
    assert e.value.path == h.tensors[3].name
    assert not _hash_threads()

    def stop(done: int, total: int) -> None:
        assert threading.current_thread() is threading.main_thread()
        if len(_hash_threads()) and done > total // 2:
            raise KeyboardInterrupt  # the user presses ^C halfway

    with pytest.raises(KeyboardInterrupt):
        tg.verify_file(path, progress=stop)
    assert not _hash_threads()
    os.truncate(path, h.data_start + h.tensors[5].begin + 10)
    with pytest.raises(tg.FormatError):
        tg.load(path, like=tree)
    assert not _hash_threads()


def test_a_file_that_shrinks_while_it_is_read_leaves_no_hashing_thread(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(1000))
    fd = os.open(path, os.O_RDONLY)
    try:
        spans = [
            hashing.Span(0, memoryview(bytearray(600))),
            hashing.Span(600, memoryview(bytearray(400))),
        ]
        os.truncate(path, 700)
        for readers in (1, 4):
            with pytest.raises(hashing.ShortRead) as e:
                hashing.read_spans(fd, spans, "blake3", chunk=64, readers=readers)
            assert e.value.index == 1
    finally:
        os.close(fd)
    assert not _hash_threads()


# -- stores --------------------------------------------------------------------


def test_a_legacy_store_and_new_blake3_versions_live_side_by_side(tmp_path: Path) -> None:
    store = tg.ArtifactStore(_copy("store", tmp_path))
    params = _legacy_params()
    _assert_trees_equal(store.load_current(params), params)
    assert store.current() == "v000001"
    assert store.verify("v000001").status == "verified"  # re-verified from its sha256 bytes
    newer = jax.tree.map(lambda x: x * 2, params)
    v2 = store.put(newer)
    v3 = store.put(params, digest="sha256")
    root = Path(store.root) / "versions"
    assert tg.read_header(root / v2 / "model.safetensors").hash_name == "blake3"
    assert tg.read_header(root / v3 / "model.safetensors").hash_name == "sha256"
    for v in (v2, v3):
        assert store.verify(v).status == "verified"
    store.promote(v2)
    _assert_trees_equal(store.load_current(params), newer)
    store.promote(v3)
    assert store.rollback() == v2
    assert store.rollback() == "v000001"
    _assert_trees_equal(store.load_version(v2, params), newer)
    _assert_trees_equal(store.load_current(params), params)
    # a flipped byte in the blake3 version is found at its re-check
    model = root / v2 / "model.safetensors"
    h = tg.read_header(model)
    with open(model, "r+b") as f:
        f.seek(h.data_start + h.tensors[1].begin)
        f.write(b"\x7f")
    with pytest.raises(tg.IntegrityError, match="blake3"):
        store.promote(v2)


def test_a_signed_legacy_store_signs_blake3_versions_the_same_way(tmp_path: Path) -> None:
    root = _copy("signed-store", tmp_path)
    store = tg.ArtifactStore(root, key=KEY)
    params = _legacy_params()
    _assert_trees_equal(store.load_current(params), params)
    v2 = store.put(params)
    assert store.verify(v2).status == "verified"
    store.promote(v2)
    _assert_trees_equal(store.load_current(params), params)
    assert store.rollback() == "v000001"
    with pytest.raises(tg.SignatureError):
        tg.ArtifactStore(root, key="another-key-0123456789abcdef0123").load_current(params)


def test_a_legacy_sharded_checkpoint_loads_and_mixes_in_a_store(tmp_path: Path) -> None:
    directory = _copy("sharded", tmp_path)
    want = {"b": np.ones(4, np.float32), "w": np.arange(32, dtype=np.float32).reshape(8, 4)}
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), want)
    _assert_trees_equal(tg.load_sharded(directory, like), want)
    store = tg.ArtifactStore(tmp_path / "s")
    tree = jax.tree.map(jnp.asarray, want)
    old = store.put_sharded(tree, digest="sha256")
    new = store.put_sharded(jax.tree.map(lambda x: x + 1, tree))
    for v in (old, new):
        assert store.verify(v).status == "verified"
    store.promote(old)
    store.promote(new)
    _assert_trees_equal(store.load_current(like), jax.tree.map(lambda x: x + 1, want))
    assert store.rollback() == old
    _assert_trees_equal(store.load_current(like), want)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_failing_hashing_thread_raises_in_the_caller(algorithm: Any) -> None:
    with pytest.raises(TypeError), hashing.Pipeline(algorithm, items=4) as p:
        p.feed(0, b"fine")
        p.feed(1, object())  # no buffer: the worker's update raises
        for _ in range(100):  # bounded: the failure stops the next feed or digests()
            p.feed(0, b"more")
        p.digests()
    assert not _hash_threads()
    closed = hashing.Pipeline(algorithm)
    closed.close()
    with pytest.raises(RuntimeError, match="closed; its digests are incomplete"):
        closed.digests()
    assert not _hash_threads()


#: The bytes a load onto devices reads and verifies at a time: one of the
#: performance page's "three 64 MiB staging buffers".
BATCH = 64 * 1024 * 1024


def test_a_load_onto_devices_in_batches_verifies_each_before_placing_it(tmp_path: Path) -> None:
    """Leaves bound to devices are read, verified and put on their devices a
    batch at a time; a corrupt tensor in any batch fails the load, and the
    error names every corrupt tensor, in this batch and in the ones not read."""
    n = (BATCH // 2 + 4096) // 4  # f32 leaves a little over half a batch: one a batch
    tree = {f"l{i}": np.full(n, i, np.float32) for i in range(3)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree)
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    like = {k: jax.ShapeDtypeStruct((n,), jnp.float32, sharding=one) for k in tree}
    loaded = tg.load(path, like=like)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded))
    _assert_trees_equal(loaded, tree)
    del loaded
    h = tg.read_header(path)
    for i in (1, 2):  # in the second batch and in the last
        with open(path, "r+b") as f:
            f.seek(h.data_start + h.tensors[i].begin + 7)
            f.write(b"\xff")
    with pytest.raises(tg.IntegrityError, match=r"2 tensors corrupt") as e:
        tg.load(path, like=like)
    assert "['l1']" in str(e.value) and "['l2']" in str(e.value)
    assert e.value.path == "['l1']"
    assert not _hash_threads()
    # a host tree is read in one batch, as before
    with pytest.raises(tg.IntegrityError, match=r"2 tensors corrupt"):
        tg.load(path, like=tree)
