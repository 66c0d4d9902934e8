"""Forged and odd checkpoint headers, and keys that would not read back.

An attacker may recompute every hash and digest, so each forged header here
is internally consistent; what must refuse it is the meaning of the header.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from forge import forge as _forge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treeguard as tg


def _edit_spec(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        spec = json.loads(meta["treeguard.spec"])
        edit(spec["tree"])
        meta["treeguard.spec"] = json.dumps(spec)

    _forge(path, mutate)


@pytest.fixture
def pair(tmp_path: Path) -> Path:
    path = tmp_path / "p.safetensors"
    tg.save(path, {"a": [np.float32([1, 2]), np.float32([3, 4])]})
    return path


# -- byte order, format version ---------------------------------------------------


def test_big_endian_dtype_in_the_spec_is_refused(pair: Path) -> None:
    def big(tree: dict[str, Any]) -> None:
        tree["children"][0][1]["children"][0][1]["dtype"] = ">f4"

    _edit_spec(pair, big)
    with pytest.raises(tg.FormatError, match="'>f4' has non-native byte order"):
        tg.load(pair)
    with pytest.raises(tg.FormatError, match="non-native byte order"):
        tg.verify_file(pair)


def test_save_writes_big_endian_arrays_in_native_order(tmp_path: Path) -> None:
    path = tmp_path / "be.safetensors"
    tg.save(path, {"w": np.arange(3, dtype=">f4")})
    out = tg.load(path)["w"]
    assert out.dtype == np.dtype("float32") and out.dtype.isnative
    assert out.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("version", ["9" * 5000, "-1", "1.0", " 1"])
def test_a_format_version_of_any_form_is_a_format_error(pair: Path, version: str) -> None:
    _forge(pair, lambda m, t: m.update({"treeguard.format": f"treeguard.checkpoint/{version}"}))
    with pytest.raises(tg.FormatError, match="unknown format"):
        tg.read_header(pair)


def test_a_spec_format_version_with_thousands_of_digits(pair: Path) -> None:
    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        spec = json.loads(meta["treeguard.spec"])
        spec["format"] = "treeguard.spec/" + "9" * 5000
        meta["treeguard.spec"] = json.dumps(spec)

    _forge(pair, mutate)
    with pytest.raises(tg.FormatError, match="not a treeguard spec"):
        tg.read_header(pair)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("treeguard.hashes", '{"a": 1, "a": 2}', "appears twice"),
        ("treeguard.metadata", '{"x": NaN}', "NaN is not a JSON number"),
        ("treeguard.env", '{"n": ' + "1" * 30 + "}", "integer of 30 digits"),
        ("treeguard.metadata", "[1]", "must be a JSON object, not list"),
        ("treeguard.env", '{"x": 1e999}', "too large for a float"),
    ],
)
def test_metadata_json_is_read_strictly(pair: Path, field: str, value: str, message: str) -> None:
    _forge(pair, lambda m, t: m.update({field: value}))
    with pytest.raises(tg.FormatError, match=message):
        tg.read_header(pair)


@pytest.mark.parametrize(
    "offsets", [[0, 8.0], [True, 8], [-8, 0], [0, 10**30]], ids=["float", "bool", "neg", "huge"]
)
def test_table_offsets_are_type_checked_and_bounded(pair: Path, offsets: list[Any]) -> None:
    _forge(pair, lambda m, t: t["['a'][0]"].update(data_offsets=offsets))
    with pytest.raises(tg.FormatError, match="data_offsets must be two non-negative|31 digits"):
        tg.read_header(pair)


# -- the stored structure ------------------------------------------------------------


def test_list_children_out_of_order_are_refused_not_mis_assigned(pair: Path) -> None:
    def swap(tree: dict[str, Any]) -> None:
        kids = tree["children"][0][1]["children"]
        kids[0][0], kids[1][0] = ["index", 1], ["index", 0]

    _edit_spec(pair, swap)
    with pytest.raises(tg.FormatError, match=r"child 0 of a list has index 1"):
        tg.load(pair)


def test_custom_node_whose_attribute_and_key_print_alike_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    tg.save(path, {"m": {"a": np.float32([1]), "b": np.float32([2])}})

    def forge(tree: dict[str, Any]) -> None:
        node = tree["children"][0][1]
        node.update(kind="custom", type="model.Net", aux=None)
        node["children"][0][0] = ["attr", "a"]
        node["children"][1][0] = ["key", "a"]

    def rename(meta: dict[str, str], table: dict[str, Any]) -> None:
        spec = json.loads(meta["treeguard.spec"])
        forge(spec["tree"])
        meta["treeguard.spec"] = json.dumps(spec)
        table["['m'].a"] = table.pop("['m']['a']")
        table["['m']['a']"] = table.pop("['m']['b']")
        hashes = json.loads(meta["treeguard.hashes"])
        hashes["['m'].a"] = hashes.pop("['m']['a']")
        hashes["['m']['a']"] = hashes.pop("['m']['b']")
        meta["treeguard.hashes"] = json.dumps(hashes)

    _forge(path, rename)
    with pytest.raises(tg.FormatError, match="both come back as key 'a' of a plain dict"):
        tg.load(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda n: n["children"][0].__setitem__(0, ["key", [1]]), "is not hashable"),
        (lambda n: n.update(kind="none"), "a none node has no children"),
        (lambda n: n["children"][0][1].update(children=[]), "a leaf has no children"),
        (lambda n: n["children"][0].__setitem__(0, ["attr", "a"]), "bad key entry"),
    ],
    ids=["unhashable", "none_with_children", "leaf_children", "attr_in_dict"],
)
def test_forged_structures_are_refused(tmp_path: Path, edit: Any, message: str) -> None:
    path = tmp_path / "d.safetensors"
    tg.save(path, {1: np.float32([1]), 2: np.float32([2])})
    _edit_spec(path, edit)
    with pytest.raises(tg.FormatError, match=message):
        tg.load(path)


def _spec_json(children: list[Any], kind: str = "dict") -> str:
    leaf = {"kind": "leaf", "shape": [1], "dtype": "float32", "weak_type": False}
    tree = {"kind": kind, "children": [[entry, leaf] for entry in children]}
    if kind == "custom":
        tree.update(type="model.Net", aux=None)
    return json.dumps({"format": "treeguard.spec/1", "tree": tree})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            _spec_json([["key", 1], ["key", True]]),
            r"\[1\] and \[True\] of builtins.dict both come back",
        ),
        (_spec_json([["attr", "a"], ["key", "a"]], "custom"), "both come back as key 'a'"),
        (_spec_json([["flat", 0], ["index", 0]], "custom"), "two children print as '\\[0\\]'"),
        (_spec_json([["key", 1]]).replace("1]", "NaN]"), "NaN is not a JSON number"),
        (_spec_json([["key", "a"], ["key", "a"]]), "two children print as"),
        (_spec_json([["key", "a"]]).replace('"tree"', '"format": 1, "tree"'), "appears twice"),
        (_spec_json([["attr", "a b"]], "custom"), "does not parse back"),
    ],
    ids=["bool_int", "attr_key", "flat_index", "nan_key", "dup_entry", "dup_field", "attr_space"],
)
def test_spec_json_is_read_strictly(text: str, message: str) -> None:
    with pytest.raises(tg.FormatError, match=message):
        tg.TreeSpec.from_json(text)


def test_tensor_table_out_of_flatten_order_is_refused(pair: Path) -> None:
    def reorder(meta: dict[str, str], table: dict[str, Any]) -> None:
        first = table.pop("['a'][0]")
        table["['a'][0]"] = first

    _forge(pair, reorder)
    with pytest.raises(tg.FormatError, match=r"lists \['a'\]\[1\] where the stored spec"):
        tg.load(pair)


def test_data_out_of_flatten_order_is_refused(pair: Path) -> None:
    def swap(meta: dict[str, str], table: dict[str, Any]) -> None:
        table["['a'][0]"]["data_offsets"], table["['a'][1]"]["data_offsets"] = [8, 16], [0, 8]

    _forge(pair, swap)
    with pytest.raises(tg.FormatError, match="stored contiguously in flatten order"):
        tg.load(pair)


# -- expect_digest ---------------------------------------------------------------


def test_expect_digest_accepts_the_recorded_digest(pair: Path) -> None:
    digest = tg.read_header(pair).digest
    assert tg.load(pair, expect_digest=digest)["a"][1].tolist() == [3, 4]
    assert tg.verify_file(pair, expect_digest=digest).digest == digest


def test_expect_digest_refuses_a_replaced_file_before_reading_data(pair: Path) -> None:
    recorded = tg.read_header(pair).digest
    tg.save(pair, {"a": [np.float32([9, 9]), np.float32([3, 4])]})
    h = tg.read_header(pair)
    with open(pair, "r+b") as f:  # also corrupt the data: the digest is checked first
        f.seek(h.data_start)
        f.write(b"\xff")
    for reader in (tg.load, tg.verify_file):
        with pytest.raises(tg.IntegrityError, match="changed since its digest was recorded") as e:
            reader(pair, expect_digest=recorded)
        assert recorded[:12] in str(e.value) and h.digest[:12] in str(e.value)
        assert e.value.context == str(pair)


@pytest.mark.parametrize("bad", ["abc", "A" * 64, 7])
def test_expect_digest_must_be_a_hex_digest(pair: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="expect_digest is a hex digest"):
        tg.load(pair, expect_digest=bad)


# -- keys that would not read back -------------------------------------------------


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


class Name(enum.StrEnum):
    W = "w"


@pytest.mark.parametrize(
    ("key", "type_name"),
    [
        (Color.RED, "Color"),
        (Level.LOW, "Level"),
        (Name.W, "Name"),
        (np.int64(3), "int64"),
        (np.float64(1.5), "float64"),
        ("\ud800", "lone surrogate"),
    ],
    ids=["enum", "int_enum", "str_enum", "np_int", "np_float", "surrogate"],
)
def test_save_refuses_keys_that_would_not_read_back(
    tmp_path: Path, key: Any, type_name: str
) -> None:
    path = tmp_path / "k.safetensors"
    with pytest.raises(tg.InvalidTreeError, match=type_name) as info:
        tg.save(path, {"layer": {key: np.float32([1])}})
    assert info.value.path == "['layer']"
    assert not path.exists()


@jax.tree_util.register_pytree_with_keys_class
class _Twin:
    """A node whose children are keyed ``.a`` and ``['a']``: both ``a`` as a dict key."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def tree_flatten_with_keys(self) -> Any:
        keys = (jax.tree_util.GetAttrKey("a"), jax.tree_util.DictKey("a"))
        return list(zip(keys, (self.x, self.y))), None

    def tree_flatten(self) -> Any:
        return (self.x, self.y), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> _Twin:
        return cls(*children)


@jax.tree_util.register_pytree_with_keys_class
class _Clash(_Twin):
    """Children keyed ``[0]`` twice: a dict key 0 and a sequence index 0."""

    def tree_flatten_with_keys(self) -> Any:
        keys = (jax.tree_util.DictKey(0), jax.tree_util.SequenceKey(0))
        return list(zip(keys, (self.x, self.y))), None


def test_save_refuses_a_node_whose_attribute_and_key_come_back_alike(tmp_path: Path) -> None:
    with pytest.raises(tg.InvalidTreeError, match=r"\.a and \['a'\] of .*_Twin both come back"):
        tg.save(tmp_path / "t.safetensors", {"m": _Twin(np.ones(1), np.zeros(1))})


def test_save_refuses_keys_that_collide_after_formatting(tmp_path: Path) -> None:
    with pytest.raises(tg.InvalidTreeError, match=r"two children print as '\[0\]'"):
        tg.save(tmp_path / "t.safetensors", {"m": _Clash(np.ones(1), np.zeros(1))})


def test_cached_structure_never_lends_its_keys_to_another_tree(tmp_path: Path) -> None:
    # {Level.LOW: x} and {True: x} and {1: x} share a treedef (their keys are equal).
    path = tmp_path / "k.safetensors"
    with pytest.raises(tg.InvalidTreeError):
        tg.save(path, {Level.LOW: np.ones(1)})
    for key in (True, 1):
        tg.save(path, {key: np.ones(1)})
        (back,) = tg.load(path)
        assert back == key and type(back) is type(key)


def test_namedtuples_and_custom_nodes_without_like_keep_every_leaf(tmp_path: Path) -> None:
    NT = collections.namedtuple("NT", "w b")

    @dataclasses.dataclass
    class Dense:
        w: Any
        b: Any

    jax.tree_util.register_dataclass(Dense, data_fields=["w", "b"], meta_fields=[])
    path = tmp_path / "n.safetensors"
    tg.save(path, {"nt": NT(np.ones(1), np.zeros(1)), "d": Dense(np.ones(2), np.zeros(2))})
    out = tg.load(path)
    assert sorted(out["nt"]) == ["b", "w"] and sorted(out["d"]) == ["b", "w"]


# -- the property -------------------------------------------------------------------

_KEYS = st.one_of(
    st.text(max_size=6),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from([Color.RED, Level.LOW, Name.W]),
    st.integers(-5, 5).map(np.int64),
    st.floats(-2, 2).map(np.float64),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(keys=st.lists(_KEYS, min_size=1, max_size=3), nested=st.booleans())
def test_any_key_round_trips_exactly_or_is_refused(
    tmp_path: Path, keys: list[Any], nested: bool
) -> None:
    kinds = {type(k) for k in keys}
    if len(kinds) > 1:  # JAX cannot sort mixed key types; one kind per dict here
        keys = [k for k in keys if type(k) is type(keys[0])]
    tree: dict[Any, Any] = {}
    for i, k in enumerate(keys):
        tree[k] = np.full(2, i, np.int8)
    if nested:
        tree = {"outer": tree}
    path = tmp_path / "prop.safetensors"
    try:
        tg.save(path, tree)
    except tg.InvalidTreeError:
        return
    out = tg.load(path)
    inner, back = (tree["outer"], out["outer"]) if nested else (tree, out)
    assert len(back) == len(inner)
    for k, v in inner.items():
        (match,) = [b for b in back if b == k and type(b) is type(k)]
        assert back[match].tolist() == v.tolist()
