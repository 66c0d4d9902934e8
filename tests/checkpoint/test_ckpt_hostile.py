"""Hostile and broken checkpoint files: each gets a typed error, runs no code and
allocates no large memory."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import tracemalloc
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from forge import forge as _forge

from treeguard import FormatError, IntegrityError, load, read_header, save, verify_file

_MARKER = "treeguard-pickle-ran"


class _Evil:
    """Unpickling this would create a marker file (code execution)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@contextmanager
def _small_memory(limit: int = 8 * 1024 * 1024) -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak {peak:,} bytes"


def _tree() -> dict[str, Any]:
    return {
        "dense1": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)},
        "emb": np.arange(8, dtype=np.int8),
    }


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    save(path, _tree(), metadata={"step": 1})
    return path


def _raw_file(path: Path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


READERS = [load, read_header, verify_file]


@pytest.mark.parametrize("reader", READERS, ids=lambda f: f.__name__)
def test_pickle_renamed_is_refused_and_never_run(tmp_path: Path, reader: Any) -> None:
    marker = tmp_path / _MARKER
    path = tmp_path / "model.safetensors"
    path.write_bytes(pickle.dumps({"w": _Evil(str(marker))}, protocol=4))
    with pytest.raises(FormatError, match="never unpickles"):
        reader(path)
    assert not marker.exists()
    z = tmp_path / "torch.safetensors"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("archive/data.pkl", pickle.dumps(_Evil(str(marker))))
    with pytest.raises(FormatError, match="pickle or zip"):
        reader(z)
    assert not marker.exists()


@pytest.mark.parametrize("reader", READERS, ids=lambda f: f.__name__)
def test_symlink_is_refused(good: Path, reader: Any) -> None:
    link = good.with_name("link.safetensors")
    link.symlink_to(good)
    with pytest.raises(FormatError, match="symbolic link"):
        reader(link)


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    with _small_memory(), pytest.raises(FormatError, match="not a regular file"):
        load("/dev/zero")
    with pytest.raises(
        FormatError, match=r"/dev/zero: the checkpoint is not a regular file but a character device"
    ):
        read_header("/dev/zero")
    with pytest.raises(FormatError, match=r"not a regular file but a directory"):
        verify_file(tmp_path)


_FIFO_READER = """
import sys
from treeguard import load, read_header, verify_file
from treeguard import FormatError
for reader in (load, read_header, verify_file):
    try:
        reader(sys.argv[1])
    except FormatError as e:
        print(reader.__name__, str(e).splitlines()[0])
    else:
        print(reader.__name__, "loaded")
"""


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    # No writer ever opens the FIFO: opening it for reading would block forever,
    # so the readers run in a subprocess that a timeout kills if they hang.
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _FIFO_READER, str(fifo)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the FIFO {fifo} blocked instead of being refused")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["load", "read_header", "verify_file"]
    for line in lines:
        assert line.endswith(f"{fifo}: the checkpoint is not a regular file but a FIFO"), line


def test_header_claiming_100_gb(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    path.write_bytes((100 * 10**9).to_bytes(8, "little") + b'{"a": 1}')
    with _small_memory(), pytest.raises(FormatError, match="over the 100,000,000-byte limit"):
        load(path)
    path.write_bytes((50 * 10**6).to_bytes(8, "little") + b'{"a": 1}')
    with _small_memory(), pytest.raises(FormatError, match="only 8 follow"):
        load(path)


def test_declared_shape_larger_than_the_file(good: Path) -> None:
    def huge(meta: dict[str, str], table: dict[str, Any]) -> None:
        spec = json.loads(meta["treeguard.spec"])
        leaf = spec["tree"]["children"][1][1]  # ['emb']
        leaf["shape"] = [10**6, 10**6]
        meta["treeguard.spec"] = json.dumps(spec)
        table["['emb']"]["shape"] = [10**6, 10**6]
        begin = table["['emb']"]["data_offsets"][0]
        table["['emb']"]["data_offsets"] = [begin, begin + 10**12]

    _forge(good, huge)
    with _small_memory(), pytest.raises(FormatError, match=r"\['emb'\]: declares bytes up to"):
        load(good)


def test_offsets_that_disagree_with_the_shape(good: Path) -> None:
    _forge(good, lambda m, t: t["['emb']"].update(data_offsets=[0, 8]))
    with pytest.raises(FormatError, match=r"\['emb'\].*needs 8 bytes|contiguous"):
        load(good)
    _forge(good, lambda m, t: t["['emb']"].update(data_offsets=[0, 4]))
    with pytest.raises(FormatError, match="needs 8 bytes"):
        load(good)


def test_overlapping_tensors(good: Path) -> None:
    def overlap(meta: dict[str, str], table: dict[str, Any]) -> None:
        table["['dense1']['w']"]["data_offsets"] = [0, 24]

    _forge(good, overlap)
    with pytest.raises(FormatError, match="contiguous"):
        load(good)


@pytest.mark.parametrize("dtype", ["X99", "F8_E4M3", "object", None])
def test_unknown_dtype_in_the_table(good: Path, dtype: Any) -> None:
    _forge(good, lambda m, t: t["['emb']"].update(dtype=dtype))
    with pytest.raises(FormatError, match=r"\['emb'\]: dtype"):
        load(good)


@pytest.mark.parametrize("dtype", ["object", "key<fry>", "nonsense", "str", "V8"])
def test_unknown_or_unsafe_dtype_in_the_spec(good: Path, dtype: str) -> None:
    def bad(meta: dict[str, str], table: dict[str, Any]) -> None:
        spec = json.loads(meta["treeguard.spec"])
        spec["tree"]["children"][1][1]["dtype"] = dtype
        meta["treeguard.spec"] = json.dumps(spec)

    _forge(good, bad)
    with _small_memory(), pytest.raises(FormatError, match="dtype"):
        load(good)


def test_non_utf8_header(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    _raw_file(path, b'{"\xff\xfe": 1}   ')
    with pytest.raises(FormatError, match="not UTF-8"):
        load(path)


@pytest.mark.parametrize(
    "header",
    [
        b'{"a": ',
        b"{" * 100_000,
        b'{"__metadata__": {"treeguard.format": 1}}',
        b"[1, 2]    ",
        b'{"x": 1, "x": 2}',
    ],
    ids=["truncated", "deep", "non_string_meta", "not_object", "duplicate_keys"],
)
def test_malformed_json(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "x.safetensors"
    _raw_file(path, header)
    with pytest.raises(FormatError):
        load(path)


def test_malformed_json_inside_metadata(good: Path) -> None:
    _forge(good, lambda m, t: m.update({"treeguard.spec": "{not json"}))
    with pytest.raises(FormatError, match="not valid JSON"):
        load(good)


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "['emb']/..", "..", "emb", "['emb'] ", "['emb'].."]
)
def test_tensor_name_that_is_not_a_key_path(good: Path, name: str) -> None:
    def rename(meta: dict[str, str], table: dict[str, Any]) -> None:
        table[name] = table.pop("['emb']")

    _forge(good, rename)
    with pytest.raises(FormatError, match="is not a key path"):
        load(good)


def test_tensor_name_absent_from_the_spec(good: Path) -> None:
    _forge(good, lambda m, t: t.__setitem__("['other']", t.pop("['emb']")))
    with pytest.raises(FormatError, match=r"\['other'\]. is not a leaf of the stored spec"):
        load(good)


def test_newer_format_version(good: Path) -> None:
    _forge(good, lambda m, t: m.update({"treeguard.format": "treeguard.checkpoint/99"}))
    with pytest.raises(FormatError, match="newer than this treeguard reads"):
        load(good)


def test_edited_header_without_new_digest(good: Path) -> None:
    raw = bytearray(good.read_bytes())
    i = raw.index(b'\\"step\\": 1')  # the user metadata, inside a JSON string
    raw[i + 10] = ord("2")
    good.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="header"):
        read_header(good)


@pytest.mark.slow
def test_truncated_at_every_byte(good: Path, tmp_path: Path) -> None:
    raw = good.read_bytes()
    cut = tmp_path / "cut.safetensors"
    for n in range(len(raw)):
        cut.write_bytes(raw[:n])
        with pytest.raises(FormatError):
            load(cut)
    cut.write_bytes(raw + b"\0")
    with pytest.raises(FormatError, match="extended"):
        load(cut)


@pytest.mark.slow
def test_a_flip_of_every_byte_is_caught_or_harmless(good: Path, tmp_path: Path) -> None:
    raw = good.read_bytes()
    ref = load(good)
    ref_bytes = [np.asarray(x).tobytes() for x in _leaves(ref)]
    rng = random.Random(0)
    bad = tmp_path / "bad.safetensors"
    harmless = 0
    for i in range(len(raw)):
        data = bytearray(raw)
        data[i] ^= rng.randrange(1, 256)
        bad.write_bytes(bytes(data))
        try:
            out = load(bad)
        except (FormatError, IntegrityError):
            continue
        harmless += 1
        # Only JSON whitespace (the header's padding) may change harmlessly.
        assert raw[i : i + 1] == b" ", (i, raw[max(0, i - 20) : i + 20])
        assert [np.asarray(x).tobytes() for x in _leaves(out)] == ref_bytes
    assert harmless < 16


def _leaves(tree: Any) -> list[Any]:
    import jax

    return jax.tree.leaves(tree)


def test_a_flipped_data_byte_names_the_tensor(good: Path) -> None:
    h = read_header(good)
    t = next(t for t in h.tensors if t.name == "['dense1']['w']")
    with open(good, "r+b") as f:
        f.seek(h.data_start + t.begin + 5)
        f.write(b"\x7f")
    with pytest.raises(IntegrityError) as info:
        load(good)
    assert info.value.path == "['dense1']['w']"
    assert "['dense1']['w']: f32[2,3]: blake3" in str(info.value)
