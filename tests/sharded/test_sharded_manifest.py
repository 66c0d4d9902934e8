"""The manifest's reader against hostile JSON, and round trips, through the
public readers: ``load_sharded`` and ``treeguard ckpt inspect DIR --json``
(which reads the manifest alone). The manifests are written by hand, field
by field, as a hostile writer would."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from machine import cpu_mesh
from shardtools import MANIFEST_NAME, sharded_digest

import treeguard
from treeguard._cli.main import main

HEX = "ab" * 32
_SPEC = treeguard.spec_of({"b": np.zeros(4, np.float32), "w": np.zeros((4, 2), np.int8)})


def _doc() -> dict[str, Any]:
    """A well-formed manifest of two processes: ``b`` in two shards, ``w`` in one."""
    return {
        "format": "treeguard.sharded/1",
        "data": "data-0123456789abcdef",
        "spec": _SPEC.to_dict(),
        "process_count": 2,
        "hash": "blake3",
        "env": {"jax": "x"},
        "metadata": {"step": 1},
        "arrays": [
            {
                "path": "['b']",
                "shape": [4],
                "dtype": "float32",
                "sharding": "single",
                "shards": [
                    {"index": [[0, 2]], "process": 0, "blake3": HEX},
                    {"index": [[2, 4]], "process": 1, "blake3": HEX},
                ],
            },
            {
                "path": "['w']",
                "shape": [4, 2],
                "dtype": "int8",
                "sharding": None,
                "shards": [{"index": [[0, 4], [0, 2]], "process": 0, "blake3": HEX}],
            },
        ],
    }


def _write(directory: Path, text: str | bytes) -> Path:
    directory.mkdir(exist_ok=True)
    raw = text.encode() if isinstance(text, str) else text
    (directory / MANIFEST_NAME).write_bytes(raw)
    return directory


def _inspect(directory: Path) -> dict[str, Any]:
    """``ckpt inspect DIR --json``'s report."""
    res = CliRunner().invoke(main, ["ckpt", "inspect", str(directory), "--json"])
    assert res.exit_code == 0, res.output
    report: dict[str, Any] = json.loads(res.output)
    return report


def _refused(directory: Path) -> treeguard.FormatError:
    """The error of ``load_sharded`` on ``directory``; the CLI says the same."""
    with pytest.raises(treeguard.FormatError) as e:
        treeguard.load_sharded(directory, _SPEC)
    res = CliRunner().invoke(main, ["ckpt", "inspect", str(directory)])
    assert res.exit_code == 2 and str(e.value).splitlines()[0] in res.output, res.output
    return e.value


def _assert_reports(report: dict[str, Any], doc: dict[str, Any]) -> None:
    """The report shows every field of ``doc`` as written."""
    for field in ("format", "data", "hash", "process_count", "env", "metadata", "spec"):
        assert report[field] == doc[field], field
    arrays = [
        (a["path"], a["dtype"], a["shape"], a["sharding"], len(a["shards"])) for a in doc["arrays"]
    ]
    assert [
        (a["path"], a["dtype"], a["shape"], a["sharding"], a["shards"]) for a in report["arrays"]
    ] == arrays
    per = [{"process": p, "shards": 0, "nbytes": 0} for p in range(doc["process_count"])]
    for a in doc["arrays"]:
        itemsize = np.dtype(treeguard.LeafSpec((), a["dtype"]).dtype).itemsize
        assert report["arrays"][doc["arrays"].index(a)]["nbytes"] == (
            int(np.prod(a["shape"])) * itemsize
        )
        for shard in a["shards"]:
            per[shard["process"]]["shards"] += 1
            per[shard["process"]]["nbytes"] += (
                int(np.prod([hi - lo for lo, hi in shard["index"]])) * itemsize
            )
    assert report["processes"] == per


def test_round_trip(tmp_path: Path) -> None:
    doc = _doc()
    ck = _write(tmp_path / "ck", json.dumps(doc))
    _assert_reports(_inspect(ck), doc)
    _write(ck, json.dumps(doc, indent=1, sort_keys=True))  # the same manifest, other bytes
    _assert_reports(_inspect(ck), doc)


def test_round_trip_of_a_save(tmp_path: Path) -> None:
    """What ``save_sharded`` writes, read back: the spec, shards and metadata."""
    mesh = cpu_mesh((2,), ("x",))  # CPU devices whatever the default backend (a TPU has one)
    b = jax.device_put(np.arange(4, dtype=np.float32), jax.sharding.NamedSharding(mesh, jax.P("x")))
    w = jax.device_put(np.arange(8, dtype=np.int8).reshape(4, 2), mesh.devices.flat[0])
    tree = {"b": b, "w": w}
    treeguard.save_sharded(tmp_path / "ck", tree, metadata={"step": 3, "note": "é"})
    report = _inspect(tmp_path / "ck")
    assert report["spec"] == treeguard.spec_of(tree, sharding=True).to_dict()
    assert report["metadata"] == {"step": 3, "note": "é"}
    assert [(a["path"], a["shards"]) for a in report["arrays"]] == [("['b']", 2), ("['w']", 1)]
    assert report["digest"] == sharded_digest(tmp_path / "ck")
    back = treeguard.load_sharded(tmp_path / "ck", tree)
    assert np.asarray(back["b"]).tolist() == [0.0, 1.0, 2.0, 3.0]


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
def test_hostile_fields(tmp_path: Path, path: tuple[Any, ...], value: Any, message: str) -> None:
    ck = _write(tmp_path / "ck", json.dumps(_set(_doc(), path, value)))
    error = _refused(ck)
    assert message in str(error)
    assert str(error).startswith(str(ck / MANIFEST_NAME))


def test_missing_field(tmp_path: Path) -> None:
    doc = _doc()
    del doc["arrays"][0]["shards"][0]["process"]
    error = _refused(_write(tmp_path / "ck", json.dumps(doc)))
    assert "arrays[0].shards[0]: missing field 'process'" in str(error)


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
def test_hostile_json(tmp_path: Path, text: str | bytes, message: str) -> None:
    assert message in str(_refused(_write(tmp_path / "ck", text)))


def test_duplicate_inside_an_array_record(tmp_path: Path) -> None:
    text = json.dumps(_doc()).replace('"dtype": "float32"', '"dtype": "float32", "dtype": "int8"')
    error = _refused(_write(tmp_path / "ck", text))
    assert "the key 'dtype' appears twice" in str(error)


def test_file_checks(tmp_path: Path) -> None:
    assert f"no {MANIFEST_NAME}: not a sharded checkpoint" in str(_refused(tmp_path))
    real = tmp_path / "real.json"
    real.write_text(json.dumps(_doc()))
    os.symlink(real, tmp_path / MANIFEST_NAME)
    assert "not a regular file" in str(_refused(tmp_path))
    os.unlink(tmp_path / MANIFEST_NAME)
    (tmp_path / MANIFEST_NAME).mkdir()
    assert "not a regular file" in str(_refused(tmp_path))


def test_digest_is_over_the_parsed_manifest(tmp_path: Path) -> None:
    """The digest is of the very bytes parsed, given only once they parse."""
    ck = _write(tmp_path / "ck", json.dumps(_doc()))
    first = _inspect(ck)["digest"]
    assert len(first) == 64 and first == _inspect(ck)["digest"] == sharded_digest(ck)
    doc = _doc()
    doc["arrays"][0]["shards"][0]["blake3"] = "cd" * 32
    _write(ck, json.dumps(doc))
    assert _inspect(ck)["digest"] not in (first, None)
    assert _inspect(ck)["digest"] == sharded_digest(ck)
    _write(ck, "{}")
    _refused(ck)


@st.composite
def _docs(draw: st.DrawFn) -> dict[str, Any]:
    nproc = draw(st.integers(1, 4))
    dtypes = ["float32", "bfloat16", "int8", "bool", "complex64"]
    tree: dict[str, Any] = {}
    arrays = []
    names = draw(
        st.lists(
            st.text("abcxyz._[]'\"", min_size=1, max_size=5), min_size=1, max_size=4, unique=True
        )
    )
    for name in sorted(names):
        shape = draw(st.lists(st.integers(1, 6), max_size=3))
        dtype = draw(st.sampled_from(dtypes))
        tree[name] = treeguard.LeafSpec(tuple(shape), dtype)
        cuts = [
            sorted(draw(st.sets(st.integers(1, n - 1), max_size=2))) if n > 1 else [] for n in shape
        ]
        bounds = [[[lo, hi] for lo, hi in zip([0, *c], [*c, n])] for c, n in zip(cuts, shape)]
        grid: list[list[list[int]]] = [[]]
        for axis in bounds:
            grid = [[*g, b] for g in grid for b in axis]
        shards = [
            {
                "index": index,
                "process": draw(st.integers(0, nproc - 1)),
                "blake3": draw(st.sampled_from([HEX, "0" * 64])),
            }
            for index in grid
        ]
        sharding = draw(st.one_of(st.none(), st.just("single")))
        arrays.append(
            {"path": f"[{name!r}]", "shape": shape, "dtype": dtype, "sharding": sharding}
            | {"shards": shards}
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
    return {
        "format": "treeguard.sharded/1",
        "data": "data-" + "f" * 16,
        "spec": treeguard.spec_of(tree).to_dict(),
        "process_count": nproc,
        "hash": "blake3",
        "env": {"jax": "v"},
        "metadata": meta,
        "arrays": arrays,
    }


@settings(max_examples=40, deadline=None)
@given(_docs())
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, doc: dict[str, Any]) -> None:
    ck = _write(tmp_path_factory.mktemp("ck"), json.dumps(doc))
    _assert_reports(_inspect(ck), doc)
