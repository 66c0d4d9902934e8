"""A checkpoint header read in memory bounded by its size.

The header is parsed strictly after ``strictjson.Shape`` has counted what
parsing it would build: a header (or the spec, hashes or metadata inside it)
whose objects would cost more than its budget is refused before any is
built. A reader written from the format's page (docs/reference/formats.md)
checks that every header, valid or forged, gets the same result or the same
error from both.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from forge import forge, header_digest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from machine import traced_peak

import treeguard as tg
from treeguard._src import strictjson  # _src: the JSON cost model: cost, depth, sharing

# -- equal objects shared: a stored spec's equal leaves, one dict --------------


def test_equal_leaves_of_a_spec_are_one_object_and_only_equal_ones() -> None:
    leaf = '{"kind": "leaf", "shape": [%s], "weak_type": %s}'
    text = (
        "[" + ",".join(leaf % p for p in [("1", "true")] * 2 + [("1", "1"), ("1.0", "true")]) + "]"
    )
    doc = strictjson.loads(text, "spec", share=lambda node: node.get("kind") == "leaf")
    assert doc == json.loads(text)
    assert doc[0] is doc[1]
    assert doc[2] is not doc[0] and doc[3] is not doc[0]  # 1, true and 1.0 stay apart
    assert [type(d["weak_type"]) for d in doc] == [bool, bool, int, bool]


# -- the cost of JSON ------------------------------------------------------------

_ENTRY_KEYS = ("dtype", "shape", "data_offsets")  # a safetensors table entry's keys

_HOSTILE_JSON = {
    "empty lists": "[" + "[]," * 20_000 + "[]]",
    "empty objects": "[" + "{}," * 20_000 + "{}]",
    "one-key objects": "[" + '{"a":1},' * 20_000 + "{}]",
    "nested lists": "[" + "[[[[]]]]," * 20_000 + "[]]",
    "pairs": "[" + "[1,2]," * 20_000 + "[]]",
    "short keys": "{" + ",".join(f'"{i:x}":0' for i in range(20_000)) + "}",
    "floats": "[" + "0.5," * 20_000 + "0.5]",
    "20-digit integers": "[" + "12345678901234567890," * 20_000 + "1]",
    "short strings": "[" + '"ab",' * 20_000 + '"ab"]',
    "non-latin strings": "[" + '"\u0100b",' * 20_000 + '"ab"]',
    "one wide character": "[" + '"a",' * 20_000 + '"\U0001f600"]',
    "a tensor table": json.dumps(
        {
            f"['b{i}']['w']": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
            for i in range(5_000)
        }
    ),
}


def _built(text: str) -> int:
    """The bytes ``json.loads`` allocates for ``text`` at its peak."""
    return traced_peak(lambda: json.loads(text))[1]


@pytest.mark.parametrize("text", _HOSTILE_JSON.values(), ids=_HOSTILE_JSON.keys())
def test_the_cost_of_json_is_bounded_above(text: str) -> None:
    # Shape.cost is what a budget is compared with: it must not be below what
    # json.loads really builds (CPython's object sizes, as tracemalloc counts)
    assert strictjson.Shape.of(text).cost >= _built(text)


def test_the_keys_of_a_table_are_counted_once_and_the_cost_still_bounds_it() -> None:
    text = _HOSTILE_JSON["a tensor table"]
    shared = strictjson.Shape.of(text, _ENTRY_KEYS)
    assert _built(text) <= shared.cost < strictjson.Shape.of(text).cost
    # a key that only ends in the text of one (its quote escaped) is a key of its own
    forged = "{" + ",".join(f'"{i}\\"dtype":0' for i in range(100)) + "}"
    assert strictjson.Shape.of(forged, _ENTRY_KEYS).shared == 0


@pytest.mark.slow
def test_another_tools_header_of_80_000_tensors_is_within_its_budget(tmp_path: Path) -> None:
    table = {
        f"model.layers.{i // 8}.mlp.w{i % 8}": {
            "dtype": "F32",
            "shape": [2, 2],
            "data_offsets": [16 * i, 16 * i + 16],
        }
        for i in range(80_000)
    }
    header = json.dumps(table, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "many.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16 * 80_000))
    assert len(tg.read_foreign(path, names="flat")) == 80_000


def _old_depth(text: str) -> int:
    """The nesting depth as the reader measured it before ``Shape``, a character at a time."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)


_JSON_TEXT = st.text(alphabet='[]{}",:\\ 0a-1.e', max_size=40)
_JSON_DOCS = st.recursive(st.integers() | st.text(max_size=3), _nest).map(json.dumps)


@given(st.one_of(_JSON_TEXT, _JSON_DOCS))
def test_the_measured_depth_is_the_old_depth(text: str) -> None:
    assert min(strictjson.Shape.of(text).depth(), 513) == min(_old_depth(text), 513)


@pytest.mark.parametrize("text", _HOSTILE_JSON.values(), ids=_HOSTILE_JSON.keys())
def test_a_document_over_its_budget_is_refused_before_it_is_built(text: str) -> None:
    with pytest.raises(tg.FormatError, match=r"^the header: its [\d,]+ bytes of JSON would take"):
        strictjson.loads(text, "the header", budget=len(text))
    assert strictjson.loads(text, "the header", budget=None) == json.loads(text)


# -- hostile headers -----------------------------------------------------------

_BIG = 6 << 20  # past the fixed 4 MiB any header may cost


def _raw_header(path: Path, header: bytes) -> Path:
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    return path


@pytest.mark.parametrize(
    "body",
    [
        b'{"x":[' + b"[]," * (_BIG // 3) + b"[]]}",
        b'{"x":[' + b"{}," * (_BIG // 3) + b"{}]}",
        b"{" + b",".join(b'"%x":0' % i for i in range(_BIG // 8)) + b"}",
        b'{"x":[' + b"0.5," * (_BIG // 4) + b"0.5]}",
        b'{"x":[' + b'"ab",' * (_BIG // 5) + b'"ab"]}',
        b'{"__metadata__":{' + b",".join(b'"%x":"a"' % i for i in range(_BIG // 10)) + b"}}",
    ],
    ids=["empty lists", "empty objects", "short keys", "floats", "short strings", "metadata keys"],
)
def test_a_header_hostile_as_json_is_refused_before_it_is_parsed(
    tmp_path: Path, body: bytes
) -> None:
    path = _raw_header(tmp_path / "h.safetensors", body)
    with pytest.raises(tg.FormatError, match="the header: its .* bytes of JSON would take about"):
        tg.read_header(path)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "g.safetensors"
    tg.save(path, {"w": np.zeros(2, np.float32)})
    return path


@pytest.mark.parametrize(
    ("field", "label"),
    [
        ("treeguard.spec", "treeguard.spec: spec"),
        ("treeguard.hashes", "treeguard.hashes"),
        ("treeguard.metadata", "treeguard.metadata"),
    ],
)
def test_a_document_in_the_header_over_its_budget_is_refused(
    good: Path, field: str, label: str
) -> None:
    # the digest recomputed, as an attacker would: only the budget stands in the way
    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta[field] = "[" + "[]," * (_BIG // 3) + "[]]"

    forge(good, mutate)
    with pytest.raises(tg.FormatError, match=f"{label}: its .* bytes of JSON would take about"):
        tg.read_header(good)


# -- the reader agrees with a reader written from the format's page ------------------

# docs/reference/formats.md: the stored dtype of each dtype these trees hold
# (float8 as its U8 bytes), and the metadata every header holds.
_STORED = {"float32": "F32", "bfloat16": "BF16", "int8": "I8", "float8_e4m3fn": "U8"}
_STORED |= {"complex64": "C64", "bool": "BOOL"}
_REQUIRED = ("treeguard.format", "treeguard.spec", "treeguard.hash", "treeguard.hashes")
_REQUIRED += ("treeguard.env", "treeguard.metadata", "treeguard.digest")
_HEX = re.compile(r"^[0-9a-f]{64}$")


def _by_the_page(raw: bytes) -> Any:
    """What the page says a file's header comes to: the fields of its
    ``Header`` (tensors as tuples), or the type of the error."""
    header_bytes = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + header_bytes])
    meta = doc.pop("__metadata__", None)
    if not isinstance(meta, dict) or any(not isinstance(v, str) for v in meta.values()):
        return tg.FormatError
    version = re.fullmatch(r"treeguard\.checkpoint/(\d+)", meta.get("treeguard.format", ""))
    if version is None or int(version[1]) > 1 or any(k not in meta for k in _REQUIRED):
        return tg.FormatError  # not ours, newer than this reads, or incomplete
    if meta["treeguard.hash"] not in ("blake3", "sha256") or not _HEX.match(meta[_REQUIRED[-1]]):
        return tg.FormatError
    if header_digest(meta, doc) != meta["treeguard.digest"]:
        return tg.IntegrityError
    try:
        spec = tg.TreeSpec.from_json(meta["treeguard.spec"])
        hashes, env, user = (json.loads(meta[k]) for k in _REQUIRED[3:6])
    except (tg.FormatError, ValueError):
        return tg.FormatError
    leaves = spec.leaves
    names = [leaf.path for leaf in leaves]
    if not all(isinstance(v, dict) for v in (hashes, env, user)) or list(doc) != names:
        return tg.FormatError  # the table names the leaves, in flatten order
    tensors, pos, data_bytes = [], 0, len(raw) - 8 - header_bytes
    for leaf in leaves:
        entry, digest = doc[leaf.path], hashes.get(leaf.path)
        nbytes = math.prod(leaf.shape) * leaf.dtype.itemsize
        stored = _STORED[leaf.dtype.name]
        want = {"dtype": stored, "shape": list(leaf.shape), "data_offsets": [pos, pos + nbytes]}
        if json.dumps(entry, sort_keys=True) != json.dumps(want, sort_keys=True):
            return tg.FormatError  # contiguous, in flatten order, as the spec's leaf is stored
        if not isinstance(digest, str) or not _HEX.match(digest):
            return tg.FormatError
        tensors.append((leaf.path, leaf.shape, leaf.dtype, stored, pos, pos + nbytes, digest))
        pos += nbytes
    if pos != data_bytes or set(hashes) != set(names):
        return tg.FormatError
    return (meta["treeguard.format"], spec, tensors, env, user, meta["treeguard.hash"])


def _as_read(path: Path) -> Any:
    """What ``read_header`` makes of a file, in the form of ``_by_the_page``."""
    try:
        h = tg.read_header(path)
    except (tg.FormatError, tg.IntegrityError) as e:
        return type(e)
    tensors = [
        (t.name, t.shape, t.dtype, t.stored_dtype, t.begin, t.end, t.digest) for t in h.tensors
    ]
    assert (h.header_bytes, h.file_bytes) == (
        int.from_bytes(path.read_bytes()[:8], "little"),
        path.stat().st_size,
    )
    return (h.format, h.spec, tensors, h.env, h.metadata, h.hash_name)


_DTYPES = ("float32", "bfloat16", "int8", "float8_e4m3fn", "complex64", "bool")
_TREES = st.dictionaries(
    st.text("abw_1", min_size=1, max_size=3),
    st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 3), max_size=3)),
    min_size=1,
    max_size=4,
)


def _edit(draw: st.DrawFn, meta: dict[str, str], table: dict[str, Any]) -> None:
    """One random edit of a header, as a forger or a flipped byte could make."""
    names = sorted(table)
    victim = table[draw(st.sampled_from(names))]
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
    value = draw(
        st.sampled_from([None, "F32", "U8", [], [1], [0, 0], [2**63, 1], "x" * 30, 1.5, True])
    )
    kind = draw(st.integers(0, 7))
    if kind == 0:
        victim[field] = value
    elif kind == 1:
        del victim[field]
    elif kind == 2:
        table["['zz']"] = copy.deepcopy(victim)
    elif kind == 3:
        del table[names[0]]
    elif kind == 4:
        key = draw(st.sampled_from(_REQUIRED[:6]))
        values = ["{}", "[]", "1", "treeguard.checkpoint/2", "treeguard.checkpoint/0"]
        # the forger hashes with the algorithm named, so it names one
        meta[key] = "sha256" if key == "treeguard.hash" else draw(st.sampled_from(values))
    elif kind == 5:
        meta["treeguard.hashes"] = json.dumps(dict.fromkeys(names, "0" * 64))
    elif kind == 6:
        victim["data_offsets"] = [victim["data_offsets"][0], victim["data_offsets"][1] + 1]
    elif kind == 7:
        table[names[-1]], table[names[0]] = table[names[0]], table[names[-1]]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=_TREES, data=st.data())
def test_every_header_reads_as_the_format_page_says(
    tmp_path: Path, tree: dict[str, Any], data: st.DataObject
) -> None:
    path = tmp_path / "c.safetensors"
    dtypes = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
    tg.save(path, {k: np.zeros(s, dtypes.get(d, d)) for k, (d, s) in tree.items()})
    edit = data.draw(st.sampled_from(["none", "forged", "edited"]))
    if edit == "forged":  # the digest recomputed
        forge(path, lambda meta, table: _edit(data.draw, meta, table))
    elif edit == "edited":  # the digest left as it was (and the header's length)
        path.write_bytes(path.read_bytes().replace(b'"data_offsets":[0,', b'"data_offsets":[1,'))
    outcomes = [_by_the_page(path.read_bytes()), _as_read(path)]
    event(outcomes[1].__name__ if isinstance(outcomes[1], type) else "read")
    assert outcomes[0] == outcomes[1]
