"""The manifest parser against hostile JSON, and a round-trip property."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeguard

# The manifest's parser on purpose: it meets hostile JSON here, and no public call
# hands a manifest out.
from treeguard._src.sharded.manifest import (  # _src: forged manifests
    MANIFEST_NAME,
    ArrayRecord,
    Manifest,
    Shard,
    is_sharded,
    parse,
    read,
    sharded_digest,
)

HEX = "ab" * 32


def _manifest() -> Manifest:
    spec = treeguard.spec_of({"b": np.zeros(4, np.float32), "w": np.zeros((4, 2), np.int8)})
    b = ArrayRecord(
        "['b']",
        (4,),
        np.dtype("float32"),
        "single",
        (Shard(((0, 2),), 0, HEX), Shard(((2, 4),), 1, HEX)),
    )
    w = ArrayRecord("['w']", (4, 2), np.dtype("int8"), None, (Shard(((0, 4), (0, 2)), 0, HEX),))
    return Manifest("data-0123456789abcdef", spec, 2, {"jax": "x"}, {"step": 1}, (b, w))


def _doc() -> dict[str, Any]:
    return json.loads(_manifest().to_json())


def test_round_trip() -> None:
    m = _manifest()
    assert parse(m.to_json()) == m


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


HOSTILE = [
    (
        "process_count_string",
        ("process_count",),
        "2",
        "process_count: expected an integer, got a string",
    ),
    (
        "process_count_bool",
        ("process_count",),
        True,
        "process_count: expected an integer, got a bool",
    ),
    ("process_count_zero", ("process_count",), 0, "process_count: 0 is out of range"),
    (
        "huge_int",
        ("arrays", 0, "shape", 0),
        10**30,
        "an integer of 31 digits is larger than any size or offset",
    ),
    ("negative_dim", ("arrays", 0, "shape", 0), -1, "arrays[0].shape[0]: -1 is out of range"),
    (
        "float_dim",
        ("arrays", 0, "shape", 0),
        4.0,
        "arrays[0].shape[0]: expected an integer, got float",
    ),
    ("arrays_object", ("arrays",), {}, "arrays: expected a list, got an object"),
    (
        "shards_string",
        ("arrays", 0, "shards"),
        "x",
        "arrays[0].shards: expected a list, got a string",
    ),
    (
        "index_pair",
        ("arrays", 0, "shards", 0, "index", 0),
        [0],
        "arrays[0].shards[0].index[0]: expected [start, stop]",
    ),
    (
        "index_axes",
        ("arrays", 0, "shards", 0, "index"),
        [],
        "arrays[0].shards[0].index: 0 axes for an array of 1",
    ),
    (
        "out_of_bounds",
        ("arrays", 0, "shards", 1, "index", 0),
        [2, 5],
        "[2, 5] is not within an axis of size 4",
    ),
    (
        "reversed",
        ("arrays", 0, "shards", 1, "index", 0),
        [4, 2],
        "[4, 2] is not within an axis of size 4",
    ),
    (
        "overlap",
        ("arrays", 0, "shards", 1, "index", 0),
        [1, 3],
        "arrays[0].shards: two shards overlap",
    ),
    (
        "gap",
        ("arrays", 0, "shards", 1, "index", 0),
        [3, 4],
        "the shards hold 3 elements, the array 4",
    ),
    (
        "process_range",
        ("arrays", 0, "shards", 1, "process"),
        2,
        "arrays[0].shards[1].process: 2 but only 2 processes wrote it",
    ),
    (
        "digest",
        ("arrays", 0, "shards", 0, "blake3"),
        "AB" * 32,
        "not a lowercase hex blake3 digest",
    ),
    (
        "digest_type",
        ("arrays", 0, "shards", 0, "blake3"),
        None,
        "blake3: expected a string, got NoneType",
    ),
    (
        "dtype",
        ("arrays", 0, "dtype"),
        "object",
        "arrays[0].dtype: dtype 'object' is not a numeric array dtype",
    ),
    ("sharding", ("arrays", 0, "sharding"), 3, "arrays[0].sharding: expected a string, got int"),
    ("path", ("arrays", 0, "path"), "['c']", "arrays[0].path: \"['c']\", the spec says \"['b']\""),
    (
        "dtype_vs_spec",
        ("arrays", 1, "dtype"),
        "uint8",
        "['w'] is uint8[4, 2], the spec says int8[4, 2]",
    ),
    ("data_escape", ("data",), "../../etc", "data: '../../etc' is not a data directory name"),
    ("hash", ("hash",), "md5", "hash: 'md5', expected one of 'blake3', 'sha256'"),
    ("env", ("env",), [], "env: expected an object, got a list"),
    ("metadata", ("metadata",), "x", "metadata: expected an object, got a string"),
    ("spec", ("spec", "format"), "nope", "spec: not a treeguard spec"),
    ("unknown_top", ("extra",), 1, "unknown field 'extra'"),
    (
        "unknown_shard",
        ("arrays", 0, "shards", 0, "crc"),
        1,
        "arrays[0].shards[0]: unknown field 'crc'",
    ),
    ("foreign", ("format",), "orbax/1", "not a treeguard sharded manifest: format is 'orbax/1'"),
    ("newer", ("format",), "treeguard.sharded/2", "is newer than this treeguard reads"),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_fields(path: tuple[Any, ...], value: Any, message: str) -> None:
    text = json.dumps(_set(_doc(), path, value))
    with pytest.raises(treeguard.FormatError) as e:
        parse(text, where="M")
    assert message in str(e.value)
    assert str(e.value).startswith("M")


def test_missing_field() -> None:
    doc = _doc()
    del doc["arrays"][0]["shards"][0]["process"]
    with pytest.raises(
        treeguard.FormatError, match=r"arrays\[0\]\.shards\[0\]: missing field 'process'"
    ):
        parse(json.dumps(doc))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "treeguard.sharded/1", "format": "x"}', "the key 'format' appears twice"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": -Infinity}', "-Infinity is not a JSON number"),
        ('{"a": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper than 512 levels"),
        ("[1, 2]", "expected a JSON object, got a list"),
        (b"\xff\xfe{", "not valid JSON"),
        ("", "not valid JSON"),
        ('{"format": 1}', "format is 1"),
    ],
    ids=[
        "duplicate",
        "nan",
        "infinity",
        "huge_digits",
        "deep",
        "list",
        "not_utf8",
        "empty",
        "format_type",
    ],
)
def test_hostile_json(text: str | bytes, message: str) -> None:
    with pytest.raises(treeguard.FormatError) as e:
        parse(text)
    assert message in str(e.value)


def test_duplicate_inside_an_array_record() -> None:
    text = (
        _manifest().to_json().replace('"dtype": "float32"', '"dtype": "float32", "dtype": "int8"')
    )
    with pytest.raises(treeguard.FormatError, match="the key 'dtype' appears twice"):
        parse(text)


def test_file_checks(tmp_path: Path) -> None:
    assert not is_sharded(tmp_path)
    with pytest.raises(
        treeguard.FormatError, match=f"no {MANIFEST_NAME}: not a sharded checkpoint"
    ):
        read(tmp_path)
    real = tmp_path / "real.json"
    real.write_text(_manifest().to_json())
    os.symlink(real, tmp_path / MANIFEST_NAME)
    assert not is_sharded(tmp_path)
    with pytest.raises(treeguard.FormatError, match="not a regular file"):
        read(tmp_path)
    os.unlink(tmp_path / MANIFEST_NAME)
    (tmp_path / MANIFEST_NAME).mkdir()
    with pytest.raises(treeguard.FormatError, match="not a regular file"):
        sharded_digest(tmp_path)


def test_digest_is_over_the_parsed_manifest(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text(_manifest().to_json())
    assert is_sharded(tmp_path)
    first = sharded_digest(tmp_path)
    assert len(first) == 64 and first == sharded_digest(tmp_path)
    doc = _doc()
    doc["arrays"][0]["shards"][0]["blake3"] = "cd" * 32
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(doc))
    assert sharded_digest(tmp_path) != first
    (tmp_path / MANIFEST_NAME).write_text("{}")
    with pytest.raises(treeguard.FormatError):
        sharded_digest(tmp_path)


@st.composite
def _manifests(draw: st.DrawFn) -> Manifest:
    nproc = draw(st.integers(1, 4))
    dtypes = ["float32", "bfloat16", "int8", "bool", "complex64"]
    tree: dict[str, Any] = {}
    records = []
    names = draw(
        st.lists(
            st.text("abcxyz._[]'\"", min_size=1, max_size=5), min_size=1, max_size=4, unique=True
        )
    )
    for name in sorted(names):
        shape = tuple(draw(st.lists(st.integers(1, 6), max_size=3)))
        dtype = treeguard.LeafSpec(shape, draw(st.sampled_from(dtypes))).dtype
        tree[name] = treeguard.LeafSpec(shape, dtype)
        cuts = [
            sorted(draw(st.sets(st.integers(1, n - 1), max_size=2))) if n > 1 else [] for n in shape
        ]
        bounds = [list(zip([0, *c], [*c, n])) for c, n in zip(cuts, shape)]
        grid: list[tuple[tuple[int, int], ...]] = [()]
        for axis in bounds:
            grid = [(*g, b) for g in grid for b in axis]
        shards = tuple(
            Shard(index, draw(st.integers(0, nproc - 1)), draw(st.sampled_from([HEX, "0" * 64])))
            for index in grid
        )
        records.append((name, shape, dtype, shards))
    spec = treeguard.spec_of(tree)
    arrays = tuple(
        ArrayRecord(f"[{n!r}]", shape, dtype, draw(st.one_of(st.none(), st.just("single"))), shards)
        for n, shape, dtype, shards in records
    )
    meta = draw(
        st.dictionaries(
            st.text(max_size=4),
            st.one_of(
                st.integers(-(2**63), 2**64),
                st.text(max_size=4),
                st.floats(allow_nan=False, allow_infinity=False),
            ),
            max_size=3,
        )
    )
    return Manifest("data-" + "f" * 16, spec, nproc, {"jax": "v"}, meta, arrays)


@settings(max_examples=40, deadline=None)
@given(_manifests())
def test_round_trip_property(m: Manifest) -> None:
    again = parse(m.to_json())
    assert again == m
    assert again.to_json() == m.to_json()
