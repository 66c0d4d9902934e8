"""A checkpoint header read in memory bounded by its size.

The header is parsed strictly after ``strictjson.Shape`` has counted what
parsing it would build: a header (or the spec, hashes or metadata inside it)
whose objects would cost more than its budget is refused before any is
built. The reading itself was split into steps; a reference copy of the
reader as it was before checks that every header, valid or forged, gets the
same result or the same error from both.
"""

from __future__ import annotations

import copy
import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from forge import forge, header_digest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import treeguard as tg
from treeguard._src import strictjson  # _src: the JSON cost model
from treeguard._src.checkpoint import format as fmt  # _src: reference reader
from treeguard._src.checkpoint import header as hdr  # _src: reference reader
from treeguard._src.checkpoint.files import (  # _src: reference reader
    open_checkpoint,
    read_raw_header,
)
from treeguard._src.checkpoint.table import expanded  # _src: reference reader

# -- the cost of JSON ------------------------------------------------------------

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
    tracemalloc.start()
    try:
        json.loads(text)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("text", _HOSTILE_JSON.values(), ids=_HOSTILE_JSON.keys())
def test_the_cost_of_json_is_bounded_above(text: str) -> None:
    # Shape.cost is what a budget is compared with: it must not be below what
    # json.loads really builds (CPython's object sizes, as tracemalloc counts)
    assert strictjson.Shape.of(text).cost >= _built(text)


def test_the_keys_of_a_table_are_counted_once_and_the_cost_still_bounds_it() -> None:
    text = _HOSTILE_JSON["a tensor table"]
    shared = strictjson.Shape.of(text, fmt.ENTRY_KEYS)
    assert _built(text) <= shared.cost < strictjson.Shape.of(text).cost
    # a key that only ends in the text of one (its quote escaped) is a key of its own
    forged = "{" + ",".join(f'"{i}\\"dtype":0' for i in range(100)) + "}"
    assert strictjson.Shape.of(forged, fmt.ENTRY_KEYS).shared == 0


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


# -- the reader agrees with the reader as it was ---------------------------------


def _reference(doc: dict[str, Any], header_bytes: int, size: int, name: str) -> tg.Header:
    """``header_from_doc`` before it was split into steps (the same checks in the same
    order, the digest by the reference hashers of ``forge``)."""
    meta = doc.pop("__metadata__", None)
    doc = {k: expanded(v) for k, v in doc.items()}  # the table as JSON holds it
    if not isinstance(meta, dict) or fmt.K_FORMAT not in meta:
        raise tg.FormatError("a safetensors file without treeguard metadata")
    if any(not isinstance(v, str) for v in meta.values()):
        raise tg.FormatError("__metadata__ values must be strings")
    version = hdr.parse_format_version(
        meta[fmt.K_FORMAT], expected=fmt.FORMAT, prefix_re=fmt._FORMAT_RE
    )
    if version > fmt.FORMAT_VERSION:
        raise tg.FormatError("newer")
    if any(k not in meta for k in fmt._REQUIRED):
        raise tg.FormatError("the header lacks")
    algorithm = meta[fmt.K_HASH]
    if algorithm not in ("blake3", "sha256") or not fmt._HEX_RE.match(meta[fmt.K_DIGEST]):
        raise tg.FormatError("unknown tensor hash, or not a digest")
    if header_digest(meta, doc) != meta[fmt.K_DIGEST]:
        raise tg.IntegrityError("header digest")
    spec = tg.TreeSpec.from_json(meta[fmt.K_SPEC])
    hashes, env, user = (hdr.strict_loads(meta[k], k) for k in fmt._REQUIRED[3:6])
    if not all(isinstance(v, dict) for v in (hashes, env, user)):
        raise tg.FormatError("must be a JSON object")
    names = hdr.leaf_names(spec, name)
    hdr._check_table_names(list(doc), names, name)
    if set(hashes) != set(names):
        raise tg.FormatError("names other tensors")
    data_bytes, pos, tensors = size - 8 - header_bytes, 0, []
    for leaf, (shape, dtype, _, _) in zip(names, spec.records):
        t = hdr._tensor_info(leaf, (shape, dtype), doc[leaf], hashes[leaf], algorithm, name)
        if t.begin != pos or t.end > data_bytes:
            raise tg.FormatError("not contiguous, or beyond the file")
        pos = t.end
        tensors.append(t)
    if pos != data_bytes:
        raise tg.FormatError("the tensors cover")
    return tg.Header(
        name, meta[fmt.K_FORMAT], spec, tuple(tensors), env, user, algorithm,
        meta[fmt.K_DIGEST], header_bytes, size,
    )  # fmt: skip


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
        key = draw(st.sampled_from(fmt._REQUIRED[:6]))
        values = ["{}", "[]", "1", "treeguard.checkpoint/2", "treeguard.checkpoint/0"]
        # the forger hashes with the algorithm named, so it names one
        meta[key] = "sha256" if key == fmt.K_HASH else draw(st.sampled_from(values))
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
def test_every_header_reads_as_the_reader_before_read_it(
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
    fd, name = open_checkpoint(path)
    try:
        doc, header_bytes, size = read_raw_header(fd, name)
    finally:
        os.close(fd)
    outcomes: list[Any] = []
    for reader in (_reference, hdr.header_from_doc):
        try:
            outcomes.append(reader(copy.deepcopy(doc), header_bytes, size, name))
        except (tg.FormatError, tg.IntegrityError) as e:
            outcomes.append(type(e))
    event(outcomes[1].__name__ if isinstance(outcomes[1], type) else "read")
    assert outcomes[0] == outcomes[1]
