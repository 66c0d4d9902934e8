"""A checkpoint's stored spec, read through ``read_header`` only, under one
budget shared with the header's table and its other documents: every spec
``TreeSpec.to_json`` writes reads as ``TreeSpec.from_json`` reads it,
anything ``from_json`` refuses is refused with its very message, and a
forged spec or hashes document that the old per-document budget (8 times the
header) let through is refused before it is built."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from forge import forge, header_digest
from hypothesis import given, settings
from hypothesis import strategies as st
from machine import traced_peak

import treeguard as tg

_BUDGET_MESSAGE = r"its [\d,]+ bytes of JSON would take about [\d,]+ bytes of objects, over the"
_FREE = 4 << 20  # docs/explanation/guarantees.md: the fixed allowance past which a header costs

#: docs/reference/formats.md: the stored dtype of each dtype these specs hold
#: (float8 as its U8 bytes, one a value).
_STORED = {"float32": "F32", "bfloat16": "BF16", "int8": "I8", "float8_e4m3fn": "U8"}
_STORED |= {"complex64": "C64", "bool": "BOOL"}


def _text(spec: tg.TreeSpec) -> str:
    """The spec's text as ``save`` stores it."""
    return spec.to_json(indent=None).rstrip("\n")


def _checkpoint(path: Path, text: str, leaves: tuple[tg.LeafSpec, ...]) -> Path:
    """A checkpoint as the format page lays it out: ``text`` its stored spec,
    a tensor of zeros for each of ``leaves`` (none for a leaf of symbolic size)."""
    table, hashes, data = {}, {}, bytearray()
    for leaf in leaves:
        concrete = all(isinstance(d, int) for d in leaf.shape)
        size = math.prod(leaf.shape) * leaf.dtype.itemsize if concrete else 0
        offsets = [len(data), len(data) + size]
        table[leaf.path] = {"dtype": _STORED[leaf.dtype.name], "shape": list(leaf.shape)}
        table[leaf.path]["data_offsets"] = offsets
        hashes[leaf.path] = blake3.blake3(bytes(size)).hexdigest()
        data += bytes(size)
    meta = {"treeguard.format": "treeguard.checkpoint/1", "treeguard.spec": text}
    meta |= {"treeguard.hash": "blake3", "treeguard.hashes": json.dumps(hashes)}
    meta |= {"treeguard.env": "{}", "treeguard.metadata": "{}"}
    meta["treeguard.digest"] = header_digest(meta, table)
    header = json.dumps({"__metadata__": meta, **table}).encode()
    header += b" " * (-len(header) % 8)  # as safetensors pads it
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def _outcome(path: Path) -> tg.TreeSpec | tg.FormatError | tg.IntegrityError:
    try:
        return tg.read_header(path).spec
    except (tg.FormatError, tg.IntegrityError) as e:
        return e


# -- honest specs read as the strict reader reads them ----------------------------

_DIMS = st.lists(st.integers(0, 3), max_size=3) | st.lists(st.integers(0, 2**40), max_size=2).map(
    lambda dims: [0, *dims]  # no bytes, however large its other sizes
)
_LEAVES = st.builds(
    tg.LeafSpec,
    _DIMS | st.lists(st.integers(0, 3) | st.sampled_from(["B", 'T"\\']), max_size=3),
    st.sampled_from(sorted(_STORED)),
    st.sampled_from([True, False, None]),
    st.sampled_from([None, "replicated", 'P("x", None) \u00e9']),
)
_TREES = st.recursive(
    _LEAVES | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3).map(tuple)
        | st.lists(inner, max_size=3)
        | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(tree=_TREES)
def test_every_spec_save_writes_reads_as_the_strict_reader_reads_it(
    tmp_path_factory: pytest.TempPathFactory, tree: Any
) -> None:
    spec = tg.spec_of(tree)
    text = _text(spec)
    path = _checkpoint(tmp_path_factory.mktemp("spec") / "c.safetensors", text, spec.leaves)
    read = _outcome(path)
    if any(isinstance(d, str) for leaf in spec.leaves for d in leaf.shape):
        assert isinstance(read, tg.FormatError) and "not concrete sizes" in read.message
        return
    assert isinstance(read, tg.TreeSpec), read
    assert read == tg.TreeSpec.from_json(text)
    assert read.to_json() == tg.TreeSpec.from_json(text).to_json() == spec.to_json()
    assert [leaf.dtype for leaf in read.leaves] == [leaf.dtype for leaf in spec.leaves]


def _stored_spec(path: Path) -> str:
    raw = path.read_bytes()
    return str(
        json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]["treeguard.spec"]
    )


def test_a_tree_of_every_kind_reads_as_the_strict_reader_reads_it(
    tmp_path: Path, corpus_tree: Any
) -> None:
    tg.save(tmp_path / "c.safetensors", corpus_tree)
    text = _stored_spec(tmp_path / "c.safetensors")
    read = tg.read_header(tmp_path / "c.safetensors").spec
    assert read == tg.TreeSpec.from_json(text) == tg.spec_of(corpus_tree)
    assert read.to_json() == tg.TreeSpec.from_json(text).to_json()


def _assert_read_alike(path: Path, edited: str) -> None:
    """What the strict reader refuses, ``read_header`` refuses with its very
    message; what it reads, ``read_header`` reads alike (or refuses for the
    table it names other tensors than, never for the spec's text)."""
    try:
        strict: tg.TreeSpec | tg.FormatError = tg.TreeSpec.from_json(edited)
    except tg.FormatError as e:
        strict = e
    read = _outcome(path)
    if isinstance(strict, tg.FormatError):
        assert isinstance(read, tg.FormatError), read
        assert read.message == f"treeguard.spec: {strict.message}"
    elif isinstance(read, tg.TreeSpec):
        assert read == strict and read.to_json() == strict.to_json()
    else:
        assert not read.message.startswith("treeguard.spec:"), read.message


_EDITS = [
    ('"float32"', '"float33"'),
    ('"float32"', '">f4"'),
    ("false", "0"),
    ("false", "true"),
    ('["index", 0]', '["index", 1]'),
    ('["key", ', '["attr", '),
    ('["key", "', '["key", "\\ud800'),
    ('["key", "', '["key", "\\q'),
    ('"kind": "dict"', '"kind": "none"'),
    ('"kind": "dict"', '"kind": "list"'),
    ('"kind": "tuple"', '"kind": "namedtuple"'),
    ('"num_leaves": ', '"num_leaves": 1'),
    ('"shape": [', '"shape": [1.0, '),
    ('"shape": [', '"shape": [NaN, '),
    ('"shape": [', '"shape": [123456789012345678901, '),
    ('"shape": [', '"shape": [-1, '),
    ("treeguard.spec/1", "treeguard.spec/2"),
    ('"weak_type": false', '"weak_type": false, "weak_type": true'),
    ('"children": [', '"children": [[["key", "x"], null], '),
    # the root's "w" twice
    ('"children": [', '"children": [[["key", "w"], {"children": [], "kind": "none"}], '),
    ('"sharding": "', '"sharding": "\\ud800'),
    ("}", "} "),
    (", ", ","),
]


@settings(max_examples=150, deadline=None)
@given(tree=_TREES, edit=st.sampled_from(_EDITS), which=st.integers(0, 5))
def test_a_spec_read_is_one_the_strict_reader_reads_alike(
    tmp_path_factory: pytest.TempPathFactory, tree: Any, edit: tuple[str, str], which: int
) -> None:
    spec = tg.spec_of({"t": tree, "w": tg.LeafSpec((2,), "float32")})
    text = _text(spec)
    old, new = edit
    at = -1
    for _ in range(which % max(1, text.count(old)) + 1):
        at = text.find(old, at + 1)
    edited = text[:at] + new + text[at + len(old) :]
    path = tmp_path_factory.mktemp("edit") / "c.safetensors"
    _assert_read_alike(_checkpoint(path, edited, spec.leaves), edited)


_FORGED = {
    "a key twice": (
        '"children": [',
        '"children": [[["key", "w"], {"children": [], "kind": "none"}], ',
    ),
    "a key not of its node": ('["key", "t"]', '["index", 0]'),
    "a lone surrogate in a sharding": ('"sharding": "', '"sharding": "\\ud800'),
    "a bad escape in a key": ('["key", "', '["key", "\\q'),
    "a field twice": ('"weak_type": false', '"weak_type": false, "weak_type": false'),
    "another leaf count": ('"num_leaves": 1', '"num_leaves": 2'),
    "children of none": (
        '[], "kind": "none"',
        '[[["key", "x"], {"children": [], "kind": "none"}]], "kind": "none"',
    ),
    "a newer format": ("treeguard.spec/1", "treeguard.spec/2"),
}


@pytest.mark.parametrize(("old", "new"), _FORGED.values(), ids=_FORGED.keys())
def test_a_forged_spec_is_refused_as_the_strict_reader_refuses_it(
    tmp_path: Path, old: str, new: str
) -> None:
    spec = tg.spec_of({"t": None, "w": tg.LeafSpec((2,), "float32", False, "replicated")})
    edited = _text(spec).replace(old, new, 1)
    with pytest.raises(tg.FormatError):
        tg.TreeSpec.from_json(edited)
    _assert_read_alike(_checkpoint(tmp_path / "c.safetensors", edited, spec.leaves), edited)


_NODE_EDITS = [
    (', "children": [', '{"children": ['),
    ('"aux": ', '"aux": {"a": 1, "a": 2}, "x": '),
    ('"aux": ', '"aux": NaN, "x": '),
    ('"aux_repr": "', '"aux_repr": "\\ud800'),
    ('"type": "', '"type": "\\q'),
    ('"kind": "custom"', '"kind": "leaf"'),
    ('"kind": "namedtuple"', '"kind": "dict"'),
    ('"kind": "none"', '"kind": "list"'),
]


@pytest.mark.parametrize(("old", "new"), _NODE_EDITS)
def test_an_edited_node_read_is_one_the_strict_reader_reads_alike(
    tmp_path: Path, corpus_tree: Any, old: str, new: str
) -> None:
    text = _text(tg.spec_of(corpus_tree))
    if old not in text:
        return
    path = tmp_path / "c.safetensors"
    tg.save(path, corpus_tree)
    edited = text.replace(old, new, 1)

    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.spec"] = edited

    forge(path, mutate)
    _assert_read_alike(path, edited)


# -- what a spec costs -----------------------------------------------------------

_SPECS = {
    "equal leaves": {f"block_{i}": {"w": tg.LeafSpec((4, 4), "float32")} for i in range(20_000)},
    # each leaf's record its own (refused from 10,000 leaves while each cost
    # its text, a dict slot and a dtype's worth beside its tuples)
    "distinct leaves": {f"{i:x}": tg.LeafSpec((0, i), "bfloat16") for i in range(20_000)},
    "distinct containers": {f"{i}": {f"k{i}": tg.LeafSpec((1,), "int8")} for i in range(20_000)},
    "deep": {"a": [[[[{"b": tg.LeafSpec((1,), "float32")}] * 20]] * 5] * 100},
    "a long list": [tg.LeafSpec((3,), "float32")] * 20_000,
}


@pytest.mark.slow  # each header of 2 to 6 MiB read under tracemalloc: about 50 s in all
@pytest.mark.parametrize("tree", _SPECS.values(), ids=_SPECS.keys())
def test_an_honest_spec_is_read_within_the_documented_budget(tmp_path: Path, tree: Any) -> None:
    spec = tg.spec_of(tree)
    path = _checkpoint(tmp_path / "c.safetensors", _text(spec), spec.leaves)
    tg.read_header(_checkpoint(tmp_path / "w.safetensors", _text(tg.spec_of({})), ()))
    header, peak = traced_peak(lambda: tg.read_header(path))
    assert header.spec == spec
    assert peak <= 3 * header.header_bytes + _FREE  # its objects, the bytes apart


@pytest.mark.slow  # 10,000 leaves saved, read and loaded: about 4 s
def test_a_tree_of_leaves_each_of_its_own_shape_reads_back(tmp_path: Path) -> None:
    # 10,000 leaves, no two records equal: written by save, then refused by
    # every read as over the header's budget until records were made smaller
    tree = {f"w{i}": np.zeros((0, i + 1), np.float32) for i in range(10_000)}
    tg.save(tmp_path / "c.safetensors", tree)
    header = tg.read_header(tmp_path / "c.safetensors")
    assert header.spec == tg.spec_of(tree)
    assert header.tensors[-1].shape == (0, 10_000)
    loaded = tg.load(tmp_path / "c.safetensors")
    assert loaded["w9999"].shape == (0, 10_000) and len(loaded) == 10_000


def test_equal_leaves_share_one_record_and_distinct_ones_do_not(tmp_path: Path) -> None:
    tree = {"a": np.zeros(2, np.int8), "b": np.zeros(2, np.int8), "c": np.zeros(3, np.int8)}
    tg.save(tmp_path / "c.safetensors", tree)
    records = tg.read_header(tmp_path / "c.safetensors").spec.records
    assert records[0] is records[1] and records[1] is not records[2]
    assert records[0][0] == (2,) and records[2][0] == (3,)


def test_equal_containers_are_one_node(tmp_path: Path) -> None:
    tree = {f"block_{i}": {"w": np.zeros(1, np.float32)} for i in range(3)}
    tg.save(tmp_path / "c.safetensors", tree)
    spec = tg.read_header(tmp_path / "c.safetensors").spec
    # the first is read before its key was ever seen, so the second is kept to share
    first, second, third = spec.structure.children
    assert second is third and first is not second
    assert spec.paths[1] == (("key", "block_1"), ("key", "w"))


# -- forged documents under the old budget, over the shared one --------------------


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "g.safetensors"
    tg.save(path, {"w": np.zeros(2, np.float32)})
    return path


def _distinct_leaves(n: int) -> str:
    leaf = '[["key", "{0:x}"], {{"dtype": "float32", "kind": "leaf", "shape": [{0}], '
    leaf += '"weak_type": false}}]'
    children = ", ".join(leaf.format(i) for i in range(n))
    tree = '{"children": [' + children + '], "kind": "dict"}'
    return f'{{"format": "treeguard.spec/1", "num_leaves": {n}, "tree": {tree}}}'


def _distinct_containers(n: int) -> str:
    leaf = '{{"dtype": "bool", "kind": "leaf", "shape": [], "weak_type": false}}'
    child = (
        '[["key", "b{0:x}"], {{"children": [[["key", "w{0:x}"], ' + leaf + ']], "kind": "dict"}}]'
    )
    children = ", ".join(child.format(i) for i in range(n))
    tree = '{"children": [' + children + '], "kind": "dict"}'
    return f'{{"format": "treeguard.spec/1", "num_leaves": {n}, "tree": {tree}}}'


_HOSTILE_SPECS = {
    # 60,000 distinct leaves: 5.4 MiB of text, about 3.4 times its bytes as
    # records (within the old 8 times past 16 MiB), with the header's other
    # parts more than 3 times the header past 4 MiB
    "distinct leaves": _distinct_leaves(60_000),
    # 20,000 containers of one key found nowhere else, their leaves all equal:
    # 2.7 MiB of text, its cost in its nodes and keys
    "distinct containers": _distinct_containers(20_000),
}


@pytest.mark.parametrize("spec", _HOSTILE_SPECS.values(), ids=_HOSTILE_SPECS.keys())
def test_a_spec_of_the_usual_form_over_the_shared_budget_is_refused(good: Path, spec: str) -> None:
    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.spec"] = spec

    forge(good, mutate)
    with pytest.raises(tg.FormatError, match="^.*treeguard.spec: spec: " + _BUDGET_MESSAGE) as e:
        tg.read_header(good)
    assert "ff" not in e.value.message  # no key of the payload echoed
    # it may be a file save wrote: the hint says what the budget is, not "not ours"
    assert e.value.hint is not None and "3 bytes of objects per byte of header" in e.value.hint
    assert "not a file treeguard.save wrote" not in e.value.hint


@pytest.mark.slow  # a 6 MiB header read under tracemalloc: about 7 s
def test_a_spec_over_the_budget_is_given_up_within_four_times_its_header(good: Path) -> None:
    # the costliest per byte of the usual form: each leaf's record its own
    spec = _HOSTILE_SPECS["distinct leaves"]

    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.spec"] = spec

    forge(good, mutate)
    tg.read_header(_checkpoint(good.with_name("w.safetensors"), _text(tg.spec_of({})), ()))

    def read() -> tg.FormatError | None:
        try:
            tg.read_header(good)
        except tg.FormatError as e:
            return e
        return None

    refused, peak = traced_peak(read)
    assert refused is not None
    assert peak <= 4 * int.from_bytes(good.read_bytes()[:8], "little") + _FREE


def test_hashes_over_the_shared_budget_are_refused(good: Path) -> None:
    # 100,000 empty lists: 104 bytes of objects for each 3 of text, within the
    # old 8 times past 16 MiB, more than 3 times the header past 4 MiB
    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.hashes"] = '{"x":[' + "[]," * 100_000 + "[]]}"

    forge(good, mutate)
    with pytest.raises(tg.FormatError, match="treeguard.hashes: " + _BUDGET_MESSAGE):
        tg.read_header(good)


@pytest.mark.slow  # 80,000 tensors saved: about 35 s of the default run on a loaded box
def test_an_honest_header_of_many_containers_reads(tmp_path: Path) -> None:
    # 40,000 containers of two leaves, 12 MiB of header, past the allowance:
    # equal containers are one node
    tree = {
        f"block_{i}": {"w": np.zeros(1, np.int8), "b": np.zeros(1, np.int8)} for i in range(40_000)
    }
    tg.save(tmp_path / "c.safetensors", tree)
    header = tg.read_header(tmp_path / "c.safetensors")
    assert header.spec == tg.spec_of(tree)
    assert json.loads(header.spec.to_json())["num_leaves"] == 80_000


@pytest.mark.slow
def test_an_honest_header_of_40_000_distinct_containers_reads(tmp_path: Path) -> None:
    # the costliest honest shape per byte: each container holds one leaf under
    # a key found nowhere else (refused past about 15,000 when the root's keys
    # were held to be checked and the hashes parsed as JSON); 13.5 MiB of header
    tree = {f"blk{i}": {f"w{i}": np.zeros(1, np.float32)} for i in range(40_000)}
    tg.save(tmp_path / "d.safetensors", tree)
    header = tg.read_header(tmp_path / "d.safetensors")
    assert header.spec == tg.spec_of(tree)
    tg.verify_file(tmp_path / "d.safetensors")  # every digest read is the tensor's
    assert header.tensors[-1].name == "['blk9999']['w9999']"  # flatten order sorts the keys


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda h: dict(reversed(h.items())), None),  # another order: read as JSON
        (lambda h: {k: v.upper() for k, v in h.items()}, "no valid blake3 digest"),
        (lambda h: {**h, "['x']": "0" * 64}, "names other tensors than the stored spec"),
        (lambda h: {"['a']": h["['a']"]}, "names other tensors than the stored spec"),
    ],
    ids=["reversed", "uppercase", "one more", "one fewer"],
)
def test_hashes_of_another_form_are_read_as_json_and_checked(
    tmp_path: Path, edit: Any, error: str | None
) -> None:
    path = tmp_path / "h.safetensors"
    tg.save(path, {"a": np.zeros(2, np.float32), "b": np.ones(3, np.int8)})
    before = tg.read_header(path)

    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.hashes"] = json.dumps(edit(json.loads(meta["treeguard.hashes"])))

    forge(path, mutate)
    if error is None:
        assert [t.digest for t in tg.read_header(path).tensors] == [
            t.digest for t in before.tensors
        ]
    else:
        with pytest.raises(tg.FormatError, match=error):
            tg.read_header(path)
