"""A header's tensor table read from its bytes into compact records, each
costed before it is built: an honest header reads as before, a hostile one
is refused under a budget of 3 times its bytes (4 with the bytes held) past
a fixed 4 MiB, and anything the scanner does not read is refused exactly as
strict JSON refuses it."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from forge import forge
from hypothesis import given, settings
from hypothesis import strategies as st

import treeguard as tg

# The scanner on purpose: its computed cost is asserted against what it really
# builds (tracemalloc), and the records it builds, neither of which a public face shows.
from treeguard._src.checkpoint import table  # _src: the scanner alone, its cost and records

_FREE = 4 << 20  # docs/explanation/guarantees.md: a header's objects may cost


def table_budget(header_bytes: int) -> int:
    """The budget the guarantees page gives a header: 3 times its bytes past 4 MiB."""
    return 3 * header_bytes + _FREE


def _st(path: Path, header: bytes, data: bytes = b"") -> Path:
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def _entries(n: int, shape: str = "[]", name: str = "{:x}") -> bytes:
    """``n`` entries of empty tensors, their names and shapes formatted with their index."""
    items = (
        f'"{name.format(i)}":{{"dtype":"F32","shape":{shape.format(i)},"data_offsets":[0,0]}}'
        for i in range(n)
    )
    return ("{" + ",".join(items) + "}").encode()


def _scan_cost(raw: bytes) -> tuple[int, int]:
    """The cost the scanner computes for ``raw`` (the least budget it reads it
    in, by bisection) and what reading it really allocates at its peak."""
    lo, hi = 0, 16 * len(raw) + _FREE
    while hi - lo > len(raw) // 64:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if table.scan(raw, mid) is not None else (mid + 1, hi)
    tracemalloc.start()
    try:
        assert table.scan(raw, hi) is not None
        return hi, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


_TABLES = {
    "short names": _entries(10_000),
    "long names": _entries(5_000, name="model.layers.{}.self_attn.q_proj.weight"),
    "one shape": _entries(5_000, shape="[1000,7,1000]"),
    "unique shapes": b"{"
    + b",".join(
        b'"%d":{"dtype":"BF16","shape":[%d,3],"data_offsets":[%d,%d]}' % (i, i, 2**40, 2**41)
        for i in range(5_000)
    )
    + b"}",
    "non-latin names": _entries(5_000, name="\u0101{}\U0001f600"),
    "long shapes": _entries(2_000, shape="[" + "1," * 60 + "{}]"),
    "metadata": json.dumps({"__metadata__": {f"k{i}": "v" * 40 for i in range(2_000)}}).encode(),
}


@pytest.mark.parametrize("raw", _TABLES.values(), ids=_TABLES.keys())
def test_the_computed_cost_bounds_what_the_scan_builds(raw: bytes) -> None:
    computed, built = _scan_cost(raw)
    assert built <= computed


@pytest.mark.parametrize("raw", _TABLES.values(), ids=_TABLES.keys())
def test_the_scan_reads_what_json_reads(raw: bytes) -> None:
    doc = table.scan(raw, 64 * len(raw) + _FREE)
    assert doc is not None
    assert {k: table.expanded(v) for k, v in doc.items()} == json.loads(raw)


def test_an_honest_header_is_read_well_within_its_budget(tmp_path: Path) -> None:
    tree = {f"block_{i:04d}": {"w": np.zeros((2, 2), np.float32)} for i in range(500)}
    tg.save(tmp_path / "c.safetensors", tree)
    raw = (tmp_path / "c.safetensors").read_bytes()
    header = raw[8 : 8 + int.from_bytes(raw[:8], "little")]
    computed, _ = _scan_cost(header)
    assert computed - _FREE < 2 * len(header)  # a third less than its budget allows
    assert tg.read_header(tmp_path / "c.safetensors").tensors[5].shape == (2, 2)


_HOSTILE = {
    # each costs more than 3 times its bytes as records: a tuple slot of 8
    # bytes per size of 2 bytes, a str of 50 bytes per name of 3
    "long shapes": _entries(15_000, shape="[" + "1," * 60 + "{}]"),
    "short names": pytest.param(_entries(200_000), marks=pytest.mark.slow),
    "wide names": _entries(30_000, name="{0:06x}" * 4 + "\U0001f600"),
}


@pytest.mark.parametrize("raw", _HOSTILE.values(), ids=list(_HOSTILE))
def test_a_table_that_costs_more_than_its_budget_is_refused(tmp_path: Path, raw: bytes) -> None:
    path = _st(tmp_path / "h.safetensors", raw)
    assert table.scan(raw, table_budget(len(raw))) is None  # given up before it was built
    with pytest.raises(tg.FormatError, match="the header: its .* bytes of JSON would take about"):
        tg.read_header(path)


def test_metadata_of_many_keys_is_refused(tmp_path: Path) -> None:
    meta = ",".join(f'"{i:x}":""' for i in range(50_000))
    raw = ('{"__metadata__":{' + meta + "}}").encode()
    assert table.scan(raw, table_budget(len(raw))) is None
    with pytest.raises(tg.FormatError, match="would take about"):
        tg.read_header(_st(tmp_path / "h.safetensors", raw))


_ENTRY = b'{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
_ODD = {
    "a duplicate key": (b'{"w":' + _ENTRY + b',"w":' + _ENTRY + b"}", "appears twice"),
    "a lone surrogate": (b'{"\\ud800":' + _ENTRY + b"}", "not valid JSON"),
    "a bad escape": (b'{"\\q":' + _ENTRY + b"}", "not valid JSON"),
    "bytes not UTF-8": (b'{"\xff":' + _ENTRY + b"}", "not UTF-8"),
    "a 21-digit offset": (
        b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,123456789012345678901]}}',
        "digits",
    ),
    "a trailing comma": (b'{"w":' + _ENTRY + b",}", "not valid JSON"),
    "text after the object": (b'{"w":' + _ENTRY + b"}x", "not valid JSON"),
    "two metadata": (b'{"__metadata__":{},"__metadata__":{}}', "appears twice"),
    "a metadata key twice": (b'{"__metadata__":{"a":"1","a":"2"}}', "appears twice"),
}


@pytest.mark.parametrize(("raw", "message"), _ODD.values(), ids=_ODD.keys())
def test_what_the_scan_does_not_read_is_refused_as_json_refuses_it(
    tmp_path: Path, raw: bytes, message: str
) -> None:
    assert table.scan(raw, table_budget(len(raw))) is None
    with pytest.raises(tg.FormatError, match=message):
        tg.read_header(_st(tmp_path / "h.safetensors", raw + b"    ", bytes(4)))


def test_a_forged_table_in_another_key_order_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    tg.save(path, {"w": np.arange(3, dtype=np.float32)})

    def reorder(meta: dict[str, str], doc: dict[str, Any]) -> None:
        entry = doc["['w']"]
        doc["['w']"] = {k: entry[k] for k in ("data_offsets", "shape", "dtype")}

    forge(path, reorder)
    np.testing.assert_array_equal(tg.load(path)["w"], np.arange(3, dtype=np.float32))


# -- the stored spec's equal leaves, one dict ------------------------------------


def test_a_leaf_equal_but_for_its_type_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    tg.save(path, {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)})

    def weak_one(meta: dict[str, str], doc: dict[str, Any]) -> None:
        spec = json.loads(meta["treeguard.spec"])
        spec["tree"]["children"][0][1]["weak_type"] = True
        spec["tree"]["children"][1][1]["weak_type"] = 1
        meta["treeguard.spec"] = json.dumps(spec)

    forge(path, weak_one)
    with pytest.raises(tg.FormatError, match=r"weak_type must be true, false or null"):
        tg.read_header(path)


# -- the scan and strict JSON agree on every header the scan reads -------------------

_FIELD_ORDERS = [
    ("dtype", "shape", "data_offsets"),
    ("shape", "dtype", "data_offsets"),
    ("data_offsets", "shape", "dtype"),
    ("shape", "data_offsets", "dtype"),
]
_BLANKS = st.sampled_from(["", " ", "\n  "])
_VALUES = {
    "dtype": st.sampled_from(["F32", "BF16", "U8", "X" * 33, "f32"]),
    "shape": st.lists(st.integers(0, 2**40), max_size=3) | st.just([1.5]) | st.just("2"),
    "data_offsets": st.lists(st.integers(0, 2**63), min_size=0, max_size=3),
}


@st.composite
def _raw_tables(draw: st.DrawFn) -> bytes:
    """A table as a writer, another tool or a forger could lay it out: any
    field order and blanks, names with escapes, odd values and duplicates."""
    blank = draw(_BLANKS)
    items = []
    for _ in range(draw(st.integers(0, 4))):
        name = json.dumps(draw(st.text(st.characters(codec="utf-8"), max_size=4)))
        order = draw(st.sampled_from(_FIELD_ORDERS))
        fields = [f"{json.dumps(k)}:{blank}{json.dumps(draw(_VALUES[k]))}" for k in order]
        items.append(f"{name}:{blank}{{{blank}{(',' + blank).join(fields)}{blank}}}")
    if draw(st.booleans()):
        meta = json.dumps(draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3))))
        items.insert(draw(st.integers(0, len(items))), f'"__metadata__":{blank}{meta}')
    if items and draw(st.booleans()):
        items.append(items[0])  # a name given twice
    return ("{" + blank + ("," + blank).join(items) + blank + "}").encode()


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    return dict(pairs)


def _refused(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _strict(raw: bytes) -> Any:
    """Strict JSON as the format page asks it, by the standard library: UTF-8,
    no key twice in an object, no NaN or Infinity (None where it refuses).
    The tables drawn hold no lone surrogates and no integer past 2**63."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_twice, parse_constant=_refused)
    except ValueError:  # json's own errors and UnicodeDecodeError among them
        return None


@settings(max_examples=300, deadline=None)
@given(_raw_tables())
def test_a_header_the_scan_reads_is_read_alike_by_strict_json(raw: bytes) -> None:
    doc = table.scan(raw, 64 * len(raw) + _FREE)
    strict = _strict(raw)
    # what the scan reads strict JSON reads alike; what it leaves, strict JSON refuses or reads
    assert doc is None or {k: table.expanded(v) for k, v in doc.items()} == strict
    if doc is not None and "__metadata__" not in doc:
        assert list(doc) == list(strict)


def test_another_tools_table_in_another_field_order_is_read_as_records(tmp_path: Path) -> None:
    raw = _entries(5_000).replace(
        b'"dtype":"F32","shape":[],"data_offsets":[0,0]',
        b'"shape":[],"data_offsets":[0,0],"dtype":"F32"',
    )
    doc = table.scan(raw, table_budget(len(raw)))
    assert doc is not None and all(type(v) is table.Entry for v in doc.values())
    path = _st(tmp_path / "h.safetensors", raw)
    with pytest.raises(tg.FormatError, match="without treeguard metadata"):
        tg.read_header(path)
