"""A stored spec read from its text into compact records, each costed before
it is built, under one budget shared with the header's table and its other
documents: every spec ``TreeSpec.to_json`` writes reads as
``TreeSpec.from_json`` reads it, anything the scan does not read is refused
exactly as strict JSON refuses it, and a forged spec or hashes document that
the old per-document budget (8 times the header) let through is refused
before it is built."""

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
# builds (tracemalloc), and which specs it reads itself, neither of which a
# public face shows.
from treeguard._src import specscan  # _src: the spec scanner alone

_BUDGET_MESSAGE = r"its [\d,]+ bytes of JSON would take about [\d,]+ bytes of objects, over the"


def _text(spec: tg.TreeSpec) -> str:
    """The spec's text as ``save`` stores it."""
    return spec.to_json(indent=None).rstrip("\n")


def _scanned(text: str, budget: int = 1 << 40) -> tg.TreeSpec | None:
    found = specscan.scan(text, budget)
    return None if found is None else tg.TreeSpec(found[0], found[1])


# -- honest specs read as the strict reader reads them ----------------------------

_KEYS = st.text(st.characters(codec="utf-8"), max_size=4) | st.integers(-(2**40), 2**40)
_LEAVES = st.builds(
    tg.LeafSpec,
    st.lists(st.integers(0, 2**40) | st.sampled_from(["B", 'T"\\']), max_size=3),
    st.sampled_from(["float32", "bfloat16", "int8", "bool", "complex64", "float8_e4m3fn"]),
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


@settings(max_examples=200, deadline=None)
@given(_TREES)
def test_every_spec_save_writes_reads_as_the_strict_reader_reads_it(tree: Any) -> None:
    spec = tg.spec_of(tree)
    text = _text(spec)
    scanned = _scanned(text)
    assert scanned is not None
    assert scanned == tg.TreeSpec.from_json(text)
    assert scanned.to_json() == tg.TreeSpec.from_json(text).to_json()
    assert [leaf.dtype for leaf in scanned.leaves] == [leaf.dtype for leaf in spec.leaves]


def test_a_tree_of_every_kind_reads_as_the_strict_reader_reads_it(corpus_tree: Any) -> None:
    text = _text(tg.spec_of(corpus_tree))
    assert _scanned(text) == tg.TreeSpec.from_json(text)


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
    ("}", "} "),
    (", ", ","),
]


@settings(max_examples=300, deadline=None)
@given(_TREES, st.sampled_from(_EDITS), st.integers(0, 5))
def test_a_spec_the_scan_reads_is_one_the_strict_reader_reads_alike(
    tree: Any, edit: tuple[str, str], which: int
) -> None:
    text = _text(tg.spec_of({"t": tree, "w": tg.LeafSpec((2,), "float32")}))
    old, new = edit
    at = -1
    for _ in range(which % max(1, text.count(old)) + 1):
        at = text.find(old, at + 1)
    _assert_read_alike(text[:at] + new + text[at + len(old) :])


def _assert_read_alike(edited: str) -> None:
    """What the scan reads the strict reader reads alike; what it refuses, the
    scan leaves to it (None), so the refusal is its own."""
    try:
        strict: tg.TreeSpec | None = tg.TreeSpec.from_json(edited)
    except tg.FormatError:
        strict = None
    scanned = _scanned(edited)
    assert scanned is None or scanned == strict


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
def test_an_edited_node_the_scan_reads_is_one_the_strict_reader_reads_alike(
    corpus_tree: Any, old: str, new: str
) -> None:
    text = _text(tg.spec_of(corpus_tree))
    if old not in text:
        return
    _assert_read_alike(text.replace(old, new, 1))


# -- what a spec costs -----------------------------------------------------------

_SPECS = {
    "equal leaves": {f"block_{i}": {"w": tg.LeafSpec((4, 4), "float32")} for i in range(3000)},
    "distinct leaves": {f"{i:x}": tg.LeafSpec((i, 2), "bfloat16") for i in range(3000)},
    "distinct containers": {f"{i}": {f"k{i}": tg.LeafSpec((1,), "int8")} for i in range(3000)},
    "deep": {"a": [[[[{"b": tg.LeafSpec((1,), "float32")}] * 20]] * 5] * 10},
    "a long list": [tg.LeafSpec((3,), "float32")] * 3000,
}


#: What the scan holds whatever the spec (within the reader's fixed allowance of
#: 4 MiB): its dicts' first tables, the match objects. It does not grow with the
#: spec: the deep case peaks about 80 KiB past its least budget on Python 3.12
#: (68 KiB on 3.11) and, made 10 and 40 times larger, under that budget.
_FIXED = 256 << 10


def _least_budget(text: str) -> int:
    """The least budget the scan reads ``text`` in, by bisection."""
    lo, hi = 0, 64 * len(text) + (1 << 20)
    while hi - lo > len(text) // 64 + 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if specscan.scan(text, mid) is not None else (mid + 1, hi)
    return hi


@pytest.mark.parametrize("tree", _SPECS.values(), ids=_SPECS.keys())
def test_the_computed_cost_bounds_what_the_scan_builds(tree: Any) -> None:
    text = _text(tg.spec_of(tree))
    budget = _least_budget(text)
    tracemalloc.start()
    try:
        assert specscan.scan(text, budget) is not None
        # past what any scan holds (its dicts' first tables, the match objects)
        assert tracemalloc.get_traced_memory()[1] <= budget + _FIXED
    finally:
        tracemalloc.stop()


def test_equal_containers_are_one_node() -> None:
    text = _text(tg.spec_of(_SPECS["equal leaves"]))
    scanned = _scanned(text)
    assert scanned is not None
    # the first is read before its key was ever seen, so the second is kept to share
    first, second, third = scanned.structure.children[:3]
    assert second is third and first is not second
    assert scanned.paths[1] == (("key", "block_1"), ("key", "w"))


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


def test_a_spec_of_the_usual_form_over_the_shared_budget_is_refused(good: Path) -> None:
    # 60,000 distinct leaves: 6 MiB of text, about 7 times its bytes as records
    # (within the old 8 times past 16 MiB), more than 3 times the header past 4 MiB
    spec = _distinct_leaves(60_000)

    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.spec"] = spec

    forge(good, mutate)
    assert specscan.scan(spec, 3 * len(spec) + (4 << 20)) is None  # given up before built
    with pytest.raises(tg.FormatError, match="^.*treeguard.spec: spec: " + _BUDGET_MESSAGE) as e:
        tg.read_header(good)
    assert "ff" not in e.value.message  # no key of the payload echoed


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
