"""Digests, through the public API: BLAKE3 for what is written now, sha256
on request and in files written before it (committed under
tests/data/legacy), both agreeing with the reference implementations over
each tensor's bytes as the format page says they are taken; mixed stores; a
flipped byte found in any chunk by both algorithms; saved and loaded trees
equal bit for bit; and no hashing thread left behind by a failed load."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Callable
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

LEGACY = Path(__file__).parents[1] / "data" / "legacy"
KEY = "legacy-fixture-key-0123456789abcdef"
ALGORITHMS = ["blake3", "sha256"]
#: The bytes the hashing engine moves and hashes at a time, counted from each
#: tensor's first byte: "the 8 MiB chunks" of the performance page
#: (docs/explanation/performance.md, "How a load moves the bytes").
CHUNK = 8 * 1024 * 1024
#: The name prefix of the hashing threads, as ``threading.enumerate()`` shows
#: them while a load runs: ``treeguard-hash-0``, ``treeguard-hash-read_0``.
HASH_THREADS = "treeguard-hash"


def _reference(data: bytes, algorithm: str) -> str:
    """The digest by the reference implementations, not by treeguard."""
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
    return [t for t in threading.enumerate() if t.name.startswith(HASH_THREADS)]


def _assert_same_bits(got: Any, want: Any) -> None:
    """The two trees' leaves have the same dtypes, shapes and bytes."""
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for x, y in zip(got_leaves, want_leaves):
        a, b = np.asarray(x), np.asarray(y)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert a.tobytes() == b.tobytes()


def _flip(path: Path, at: int) -> None:
    """Flips the top bit of the byte at file offset ``at``."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x80]), at)
    finally:
        os.close(fd)


def _as_written(path: Path) -> tuple[dict[str, str], dict[str, bytes]]:
    """The header's ``__metadata__`` and each tensor's bytes, read as the
    format page reads a checkpoint without treeguard."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    table = json.loads(raw[8 : 8 + n])
    meta = table.pop("__metadata__")
    data = raw[8 + n :]
    return meta, {k: data[t["data_offsets"][0] : t["data_offsets"][1]] for k, t in table.items()}


def _corrupt(name: str, algorithm: str) -> str:
    """The start of the error naming one corrupt tensor."""
    return rf"1 tensor corrupt \({algorithm} mismatch\):\n  {re.escape(name)}: .*: {algorithm} "


def _check_digests_and_flip(path: Path, tree: dict[str, Any], algorithm: Any, data: Any) -> None:
    """Saves ``tree``; the digests recorded are the reference ones over each
    tensor's bytes (as held, and as written), it loads bit for bit and
    verifies; then one byte drawn from ``data`` is flipped, and load and
    verify_file both name that tensor, leaving no hashing thread."""
    held = {k: np.asarray(v).tobytes() for k, v in tree.items()}
    tg.save(path, tree, digest=algorithm)
    assert {k: np.asarray(v).tobytes() for k, v in tree.items()} == held  # inputs untouched
    meta, written = _as_written(path)
    assert meta["treeguard.hash"] == algorithm
    recorded = json.loads(meta["treeguard.hashes"])
    names = {f"['{k}']": k for k in tree}
    assert set(recorded) == set(written) == set(names)
    for name, k in names.items():
        assert written[name] == held[k]
        assert recorded[name] == _reference(held[k], algorithm), name
    _assert_same_bits(tg.load(path, like=tree), tree)
    h = tg.verify_file(path, like=tree)
    assert [t.digest for t in h.tensors] == [recorded[t.name] for t in h.tensors]
    filled = [t for t in h.tensors if t.nbytes]
    if filled:
        t = data.draw(st.sampled_from(filled), label="tensor")
        near = [o for o in (0, CHUNK - 1, CHUNK, 2 * CHUNK - 1, 2 * CHUNK) if o < t.nbytes]
        at = data.draw(
            st.one_of(st.integers(0, t.nbytes - 1), st.sampled_from([*near, t.nbytes - 1])),
            label="offset",
        )
        _flip(path, h.data_start + t.begin + at)
        with pytest.raises(tg.IntegrityError, match=_corrupt(t.name, algorithm)) as e:
            tg.load(path, like=tree)
        assert e.value.path == t.name
        with pytest.raises(tg.IntegrityError, match=_corrupt(t.name, algorithm)):
            tg.verify_file(path)
    assert not _hash_threads()


#: Each leaf's dtype, and how it is held: a plain array, a read-only one, or
#: a read-only mapping of a file (``np.memmap``).
DTYPES = [np.dtype(np.uint8), np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.int64)]
HOLDERS = ["plain", "read-only", "memory-mapped"]


def _leaf(directory: Path, i: int, dtype: np.dtype[Any], n: int, holder: str, seed: int) -> Any:
    """``n`` elements of random bits (NaN payloads included), held as ``holder`` says."""
    raw = np.random.default_rng([seed, i]).bytes(n * dtype.itemsize)
    arr = np.frombuffer(raw, dtype).copy()
    if holder == "read-only":
        arr.setflags(write=False)
    elif holder == "memory-mapped" and n:
        arr.tofile(directory / f"leaf{i}.bin")
        return np.memmap(directory / f"leaf{i}.bin", dtype, mode="r", shape=(n,))
    return arr


# -- what save records, what load and verify_file find ---------------------------


@settings(max_examples=12)
@given(
    algorithm=st.sampled_from(ALGORITHMS),
    leaves=st.lists(
        st.tuples(st.sampled_from(DTYPES), st.integers(0, 3000), st.sampled_from(HOLDERS)),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_recorded_digests_are_the_references_and_a_flipped_byte_is_found(
    tmp_path_factory: pytest.TempPathFactory,
    algorithm: str,
    leaves: list[tuple[np.dtype[Any], int, str]],
    seed: int,
    data: st.DataObject,
) -> None:
    """Tensors of drawn sizes (in a load's one buffer, each mostly starts in
    the page the one before ends in), each a plain, read-only or
    memory-mapped array: saved unchanged, recorded with the reference
    digests, loaded bit for bit; a byte flipped anywhere is found."""
    directory = tmp_path_factory.mktemp("d")
    tree = {
        f"l{i}": _leaf(directory, i, dtype, n, holder, seed)
        for i, (dtype, n, holder) in enumerate(leaves)
    }
    _check_digests_and_flip(directory / "p.safetensors", tree, algorithm, data)


@settings(max_examples=8)
@given(
    algorithm=st.sampled_from(ALGORITHMS),
    sizes=st.lists(
        st.builds(lambda k, d: max(0, k * CHUNK + d), st.integers(0, 3), st.integers(-4100, 4100)),
        min_size=1,
        max_size=3,
    ),
    data=st.data(),
)
@pytest.mark.slow
def test_in_tensors_of_several_chunks_a_flipped_byte_is_found_in_any_chunk(
    tmp_path_factory: pytest.TempPathFactory, algorithm: str, sizes: list[int], data: st.DataObject
) -> None:
    """Tensors of up to three chunks and a bit, of drawn sizes; a byte
    flipped anywhere, at chunk boundaries more often, is found."""
    directory = tmp_path_factory.mktemp("d")
    tree = {f"l{i}": _leaf(directory, i, DTYPES[0], n, "plain", i) for i, n in enumerate(sizes)}
    _check_digests_and_flip(directory / "p.safetensors", tree, algorithm, data)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_flipped_byte_in_either_chunk_or_either_side_of_their_boundary_is_found(
    tmp_path: Path, algorithm: Any
) -> None:
    """A tensor of two chunks, the second short, after a tensor of 12 bytes
    (so it starts inside a page of the load's buffer): its recorded digest is
    the reference one, as is the digest an import records of the whole file;
    it loads bit for bit, and a flip in its first byte, on either side of the
    boundary and in its last byte is found by load and verify_file, each time
    with the file's own algorithm."""
    n = (CHUNK + 4100) // 4
    tree = {"a": np.ones(3, np.float32), "w": np.random.default_rng(3).random(n, np.float32)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree, digest=algorithm)
    h = tg.read_header(path)
    w = h.tensors[1]
    assert (h.hash_name, w.name, w.nbytes) == (algorithm, "['w']", 4 * n)
    assert w.digest == _reference(tree["w"].tobytes(), algorithm)
    _assert_same_bits(tg.load(path, like=tree), tree)
    # an import records the digest of its whole source file, of two chunks too
    imported = tg.import_weights(path, tmp_path / "imported.safetensors", digest=algorithm)
    assert imported.metadata["imported_from"][algorithm] == _reference(path.read_bytes(), algorithm)
    text = rf"1 tensor corrupt \({algorithm} mismatch\):\n  \['w'\]: f32\[{n}\]: {algorithm} "
    for offset in (0, CHUNK - 1, CHUNK, w.nbytes - 1):
        _flip(path, h.data_start + w.begin + offset)
        with pytest.raises(tg.IntegrityError, match=text):
            tg.load(path, like=tree)
        with pytest.raises(tg.IntegrityError, match=text):
            tg.verify_file(path)
        _flip(path, h.data_start + w.begin + offset)  # back as it was
    assert not _hash_threads()
    tg.verify_file(path, like=tree)


def test_an_unknown_algorithm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    with pytest.raises(ValueError, match="digest must be one of 'blake3', 'sha256', got 'md5'"):
        tg.save(path, {"w": np.ones(2)}, digest="md5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="digest must be one of"):
        tg.ArtifactStore(tmp_path / "s").put({"w": np.ones(2)}, digest="sha1")  # type: ignore[arg-type]
    assert not path.exists() and not list((tmp_path / "s" / "versions").glob("v*"))


# -- checkpoints -----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_either_algorithm_round_trips_and_stays_safetensors(tmp_path: Path, algorithm: Any) -> None:
    params = _legacy_params()
    path = tmp_path / "p.safetensors"
    tg.save(path, params, digest=algorithm)
    h = tg.verify_file(path, like=params)
    assert h.hash_name == algorithm and h.tensors[0].digest == _reference(
        np.zeros(6, np.float32).tobytes(), algorithm
    )
    _assert_same_bits(tg.load(path, like=params), params)
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
    _assert_same_bits(tg.load(path, like=params, expect_digest=h.digest), params)
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


class _Hooked:
    """A hasher of the reference implementation that calls ``on_bytes`` with
    the name of the thread it hashes tensor bytes in (memoryviews; a header
    is hashed as bytes) before hashing them."""

    def __init__(self, real: Any, on_bytes: Callable[[str], None]) -> None:
        self._real, self._on_bytes = real, on_bytes

    def update(self, data: Any) -> None:
        if isinstance(data, memoryview) and len(data):
            self._on_bytes(threading.current_thread().name)
        self._real.update(data)

    def hexdigest(self) -> str:
        return str(self._real.hexdigest())


def _hook(monkeypatch: pytest.MonkeyPatch, algorithm: str, on_bytes: Callable[[str], None]) -> None:
    """Makes every new hasher of ``algorithm`` a ``_Hooked`` one."""
    if algorithm == "blake3":
        real3 = blake3.blake3

        class Blake3(_Hooked):
            AUTO = real3.AUTO

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(real3(*args, **kwargs), on_bytes)

        monkeypatch.setattr(blake3, "blake3", Blake3)
    else:
        real = hashlib.sha256
        monkeypatch.setattr(hashlib, "sha256", lambda *a: _Hooked(real(*a), on_bytes))


#: Before the first hash, at most about two tensors a hashing thread are fed
#: (sha256 runs one a core; each tensor goes as an empty item, then its one
#: chunk, into a queue of two) and some 16 more are being read: a tree of
#: ``96 + AHEAD * cores`` tensors cut two thirds in (past 64 + 2 * cores) is
#: cut beyond them on any machine.
AHEAD = 3


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_file_that_shrinks_while_it_is_read_is_refused_leaving_no_hashing_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    """The file is cut two thirds of the way in (``AHEAD``) once the first
    chunk is read: by verify_file's progress, and, for a load, by the first
    hash of tensor bytes. Both name the tensor cut. (A fixed cut, 64 of 96
    tensors, could be read before the first hash on 25 cores or more.)"""
    count = 96 + AHEAD * (os.cpu_count() or 1)
    cut_at = 2 * count // 3
    tree = {f"w{i:04}": np.full(1024, i, np.float32) for i in range(count)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree, digest=algorithm)  # type: ignore[arg-type]
    h = tg.read_header(path)
    cut = h.data_start + h.tensors[cut_at].begin + 10

    def shrink(*_: object) -> None:
        if os.path.getsize(path) > cut:
            os.truncate(path, cut)

    with pytest.raises(tg.FormatError, match="the file was truncated while it was verified"):
        tg.verify_file(path, progress=shrink)
    assert not _hash_threads()
    tg.save(path, tree, digest=algorithm)  # type: ignore[arg-type]
    seen: list[str] = []

    def note_and_shrink(name: str) -> None:
        seen.append(name)
        shrink()

    _hook(monkeypatch, algorithm, note_and_shrink)
    message = rf"tensor \['w{cut_at:04}'\]: the file was truncated while it was read"
    with pytest.raises(tg.FormatError, match=message):
        tg.load(path, like=tree)
    assert seen and all(name.startswith(HASH_THREADS) for name in seen)
    assert not _hash_threads()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_failing_hashing_thread_raises_in_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: Any
) -> None:
    """A hasher that fails in its thread (here: out of memory) fails the
    save, the load and the verification that use it, in the caller, and
    leaves no thread behind; the file saved before is untouched."""
    tree = {f"w{i}": np.full(3000, i, np.float32) for i in range(4)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree, digest=algorithm)
    before = path.read_bytes()

    def fail(name: str) -> None:
        assert name.startswith(HASH_THREADS), name
        raise MemoryError("no memory for the hash state")

    _hook(monkeypatch, algorithm, fail)
    for call in (
        lambda: tg.save(path, {k: v + 1 for k, v in tree.items()}, digest=algorithm),
        lambda: tg.load(path, like=tree),
        lambda: tg.verify_file(path),
    ):
        with pytest.raises(MemoryError, match="no memory for the hash state"):
            call()
        assert not _hash_threads()
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.safetensors"]
    _assert_same_bits(tg.load(path, like=tree), tree)


# -- stores --------------------------------------------------------------------


def test_a_legacy_store_and_new_blake3_versions_live_side_by_side(tmp_path: Path) -> None:
    store = tg.ArtifactStore(_copy("store", tmp_path))
    params = _legacy_params()
    _assert_same_bits(store.load_current(params), params)
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
    _assert_same_bits(store.load_current(params), newer)
    store.promote(v3)
    assert store.rollback() == v2
    assert store.rollback() == "v000001"
    _assert_same_bits(store.load_version(v2, params), newer)
    _assert_same_bits(store.load_current(params), params)
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
    _assert_same_bits(store.load_current(params), params)
    v2 = store.put(params)
    assert store.verify(v2).status == "verified"
    store.promote(v2)
    _assert_same_bits(store.load_current(params), params)
    assert store.rollback() == "v000001"
    with pytest.raises(tg.SignatureError):
        tg.ArtifactStore(root, key="another-key-0123456789abcdef0123").load_current(params)


def test_a_legacy_sharded_checkpoint_loads_and_mixes_in_a_store(tmp_path: Path) -> None:
    directory = _copy("sharded", tmp_path)
    want = {"b": np.ones(4, np.float32), "w": np.arange(32, dtype=np.float32).reshape(8, 4)}
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), want)
    _assert_same_bits(tg.load_sharded(directory, like), want)
    store = tg.ArtifactStore(tmp_path / "s")
    tree = jax.tree.map(jnp.asarray, want)
    old = store.put_sharded(tree, digest="sha256")
    new = store.put_sharded(jax.tree.map(lambda x: x + 1, tree))
    for v in (old, new):
        assert store.verify(v).status == "verified"
    store.promote(old)
    store.promote(new)
    _assert_same_bits(store.load_current(like), jax.tree.map(lambda x: x + 1, want))
    assert store.rollback() == old
    _assert_same_bits(store.load_current(like), want)


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
    _assert_same_bits(loaded, tree)
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


@pytest.mark.slow
def test_a_load_into_one_memory_mapping_is_bit_for_bit(tmp_path: Path) -> None:
    """A host load this large reads into one anonymous memory mapping (the
    performance page), its reader threads faulting in each chunk's pages
    before they read it; the tensors are not whole pages, so each starts in
    the page the one before ends in, and each loads bit for bit."""
    tree = {f"l{i}": np.random.default_rng(i).random(BATCH // 12 + i, np.float32) for i in range(4)}
    path = tmp_path / "p.safetensors"
    tg.save(path, tree)
    _assert_same_bits(tg.load(path, like=tree), tree)
    assert not _hash_threads()
