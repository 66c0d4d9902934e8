"""A header's tensor table, read through ``read_header`` and ``read_foreign``
only: whatever its layout it reads as JSON reads it (docs/reference/formats.md
gives what it means), anything strict JSON refuses is refused as strict JSON
refuses it, and the cost the guarantees page documents holds: reading a
header takes at most 3 times its bytes as objects past a fixed 4 MiB, and a
table that would take more is refused before it is built."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from forge import forge, header_digest
from hypothesis import given, settings
from hypothesis import strategies as st
from machine import traced_peak

import treeguard as tg

_FREE = 4 << 20  # docs/explanation/guarantees.md: the fixed allowance past which a header costs


def _budget(header_bytes: int, times: int = 3) -> int:
    """The guarantees page's budget: 3 times the header's bytes as objects
    past 4 MiB; 4 times with the bytes themselves held."""
    return times * header_bytes + _FREE


def _peak(read: Callable[[], Any]) -> tuple[Any, int]:
    """What ``read`` returns (or the ``FormatError`` it raises) and the most
    bytes of Python objects it held at once (tracemalloc)."""

    def caught() -> Any:
        try:
            return read()
        except tg.FormatError as e:
            return e

    return traced_peak(caught)


def _st(path: Path, header: bytes, data: bytes = b"") -> Path:
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def _entries(n: int, shape: str = "[0]", name: str = "{:x}") -> bytes:
    """``n`` entries of empty tensors, their names and shapes formatted with their index."""
    items = (
        f'"{name.format(i)}":{{"dtype":"F32","shape":{shape.format(i)},"data_offsets":[0,0]}}'
        for i in range(n)
    )
    return ("{" + ",".join(items) + "}").encode()


_DTYPES = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "U8": np.uint8}


def _as_json_reads(raw: bytes) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Each tensor of a foreign table as its JSON reads: dtype and shape."""
    doc = json.loads(raw)
    doc.pop("__metadata__", None)
    return {k: (np.dtype(_DTYPES[v["dtype"]]), tuple(v["shape"])) for k, v in doc.items()}


def _as_read(path: Path) -> dict[str, tuple[Any, tuple[int, ...]]]:
    return {k: (a.dtype, a.shape) for k, a in tg.read_foreign(path, names="flat").items()}


_TABLES = {
    "short names": _entries(1_000),
    "long names": _entries(2_000, name="model.layers.{}.self_attn.q_proj.weight"),
    "one shape": _entries(2_000, shape="[1000,0,1000]"),
    "unique large shapes": _entries(2_000, shape="[0,1{}99999999999999]"),
    "non-latin names": _entries(2_000, name="\u0101{}\U0001f600"),
    "long shapes": _entries(1_000, shape="[0," + "1," * 60 + "{}]"),
    "metadata": b'{"__metadata__":{'
    + ",".join(f'"k\\u00e9{i}":"v\\"{i}"' for i in range(2_000)).encode()
    + b'},"w":{"data_offsets":[0,2],"dtype":"BF16","shape":[1]}}',
}


@pytest.mark.parametrize("raw", _TABLES.values(), ids=_TABLES.keys())
def test_a_foreign_table_reads_what_json_reads(tmp_path: Path, raw: bytes) -> None:
    data = bytes(2) if b'"BF16"' in raw else b""
    assert _as_read(_st(tmp_path / "f.safetensors", raw, data)) == _as_json_reads(raw)


# -- the documented cost ------------------------------------------------------------


def _reordered(n: int) -> bytes:
    return _entries(n).replace(
        b'"dtype":"F32","shape":[0],"data_offsets":[0,0]',
        b'"shape":[0],"data_offsets":[0,0],"dtype":"F32"',
    )


@pytest.mark.parametrize("order", ["usual", "another"])
def test_an_honest_table_too_costly_as_json_is_read(tmp_path: Path, order: str) -> None:
    # 20,000 tensors, 1.1 MiB: parsed as JSON (about 9 times its bytes, over its
    # budget) it would be refused though honest; read as records, in any field order
    raw = _entries(20_000) if order == "usual" else _reordered(20_000)
    found = tg.read_foreign(_st(tmp_path / "f.safetensors", raw), names="flat")
    assert len(found) == 20_000 and found[f"{19_999:x}"].shape == (0,)


_LONG_SHAPES = _entries(15_000, shape="[" + "1," * 60 + "{}]")
_HOSTILE = {
    # each costs more than 3 times its bytes as records (a str of 50 bytes per
    # name of 3, of 4 bytes a character past ASCII); long shapes below
    "short names": pytest.param(_entries(200_000), marks=pytest.mark.slow),
    "wide names": _entries(30_000, name="{0:06x}" * 4 + "\U0001f600"),
    "metadata of many keys": (
        '{"__metadata__":{' + ",".join(f'"{i:x}":""' for i in range(50_000)) + "}}"
    ).encode(),
}
_OVER = r"the header: its [\d,]+ bytes of JSON would take about ([\d,]+) bytes"


@pytest.mark.parametrize("raw", _HOSTILE.values(), ids=list(_HOSTILE))
def test_a_table_that_costs_more_than_its_budget_is_refused(tmp_path: Path, raw: bytes) -> None:
    with pytest.raises(tg.FormatError, match=_OVER):
        tg.read_header(_st(tmp_path / "h.safetensors", raw))


def test_a_table_over_its_budget_is_refused_before_it_is_built(tmp_path: Path) -> None:
    # a tuple slot of 8 bytes per size of 2 bytes: the costliest as records, so
    # those built before it is given up come nearest to its budget
    path = _st(tmp_path / "h.safetensors", _LONG_SHAPES)
    tg.read_foreign(_st(tmp_path / "warm.safetensors", _entries(2)), names="flat")
    refused, peak = _peak(lambda: tg.read_header(path))
    assert isinstance(refused, tg.FormatError)
    over = re.search(_OVER, refused.message)
    assert over is not None, refused.message
    # within the budget with its bytes held, far below what parsing it would take
    assert peak <= _budget(len(_LONG_SHAPES), times=4)
    assert peak < int(over[1].replace(",", "")) // 2


# -- a treeguard header, in any layout strict JSON reads alike ---------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, tg.Header]:
    """A checkpoint's bytes, as ``save`` wrote them, and its header as read."""
    path = tmp_path_factory.mktemp("template") / "t.safetensors"
    tree = {"a\u00e9\"'": np.arange(3, dtype=np.float32), "b": [np.zeros((2, 0), np.int8)]}
    tg.save(path, tree, metadata={"note": 'a "quoted" \\ \u00e9 \U0001f600 line\n'})
    return path.read_bytes(), tg.read_header(path)


def _doc(raw: bytes) -> dict[str, Any]:
    return dict(json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")]))


def _escaped(text: str, which: list[bool]) -> str:
    """``text`` as a JSON string token, each character ``which`` says as a ``\\u`` escape."""
    out = []
    for ch, escape in zip(text, which + [False] * len(text)):
        if escape or ch in '"\\' or ch < " ":
            out.append("".join(f"\\u{u:04x}" for u in _utf16(ch)))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _utf16(ch: str) -> list[int]:
    units = ch.encode("utf-16-be")
    return [int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)]


def _signed(text: str, data: bytes) -> bytes:
    """A file of this header text, its digest (``@DIGEST@`` in it) computed
    over what JSON reads (its last value where a key is given twice)."""
    try:
        doc = json.loads(text.replace("@DIGEST@", "0" * 64))
        meta = doc.pop("__metadata__")
        digest = header_digest(meta, doc)
    except ValueError:  # no JSON at all: any digest
        digest = "0" * 64
    header = text.replace("@DIGEST@", digest).encode("utf-8", "surrogateescape")
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + data


_FIELD_ORDERS = [
    ("dtype", "shape", "data_offsets"),
    ("shape", "dtype", "data_offsets"),
    ("data_offsets", "shape", "dtype"),
    ("shape", "data_offsets", "dtype"),
]
_BLANKS = st.sampled_from(["", " ", "\n  ", "\t"])
_ODD_VALUES = {
    "dtype": st.sampled_from(["F32", "I8", "X" * 33, "f32"]),
    "shape": st.sampled_from([[3], [2, 0], [1.5], "2", [12345678901234567890]]),
    "data_offsets": st.sampled_from([[0, 12], [12, 12], [0], [0, 12, 12], [0, 2**63]]),
}


@st.composite
def _layouts(draw: st.DrawFn, doc: dict[str, Any]) -> str:
    """The header ``doc`` as another writer or a forger could lay it out: any
    field order and blanks, strings escaped, maybe an odd value or a name twice."""
    blank = draw(_BLANKS)
    meta = dict(doc["__metadata__"], **{"treeguard.digest": "@DIGEST@"})
    pairs = [
        f"{_escaped(k, draw(st.lists(st.booleans())))}:{blank}"
        + ('"@DIGEST@"' if v == "@DIGEST@" else _escaped(v, draw(st.lists(st.booleans()))))
        for k, v in meta.items()
    ]
    items = [f'"__metadata__":{blank}{{{("," + blank).join(pairs)}}}']
    for name, stored in doc.items():
        if name == "__metadata__":
            continue
        entry = dict(stored)
        if draw(st.integers(0, 5)) == 0:
            field = draw(st.sampled_from(_FIELD_ORDERS[0]))
            entry[field] = draw(_ODD_VALUES[field])
        fields = [
            f'"{k}":{blank}{json.dumps(entry[k])}' for k in draw(st.sampled_from(_FIELD_ORDERS))
        ]
        token = _escaped(name, draw(st.lists(st.booleans())))
        items.append(f"{token}:{blank}{{{blank}{(',' + blank).join(fields)}{blank}}}")
    if draw(st.integers(0, 5)) == 0:
        items.insert(draw(st.integers(0, len(items))), items[draw(st.integers(0, len(items) - 1))])
    return "{" + blank + ("," + blank).join(items) + blank + "}"


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    return dict(pairs)


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_a_header_in_any_layout_reads_as_strict_json_reads_it(
    template: tuple[bytes, tg.Header], tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    raw, before = template
    original = _doc(raw)
    text = data.draw(_layouts(original))
    path = tmp_path_factory.mktemp("layout") / "c.safetensors"
    path.write_bytes(_signed(text, raw[8 + int.from_bytes(raw[:8], "little") :]))
    try:  # strict JSON as the format page asks it: no key twice
        strict: Any = json.loads(text.replace("@DIGEST@", "0" * 64), object_pairs_hook=_no_twice)
    except ValueError:
        strict = None
    original["__metadata__"]["treeguard.digest"] = "0" * 64
    if strict != original:
        # what strict JSON refuses, or reads as another table, is refused, never taken
        # for another header (its digest is of what JSON reads)
        with pytest.raises(tg.FormatError):
            tg.read_header(path)
        return
    header = tg.read_header(path)
    assert header.tensors == before.tensors
    assert (header.spec, header.metadata, header.env) == (before.spec, before.metadata, before.env)


def _before(old: str, new: str) -> Callable[[str], str]:
    return lambda text: text.replace(old, new + old, 1)


_B0 = "\"['b'][0]\":"
_EMPTY = '{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
#: Each forged into the template's header, its digest that of what JSON reads
#: (its last value where a key is given twice): only the strict reading refuses it.
_ODD = {
    "a duplicate key": (_before(_B0, _B0 + _EMPTY), "appears twice"),
    "a lone surrogate": (_before('"treeguard.hash":', '"\\ud800":"",'), "not valid JSON"),
    "a bad escape": (_before('"treeguard.hash":', '"\\q":"",'), "not valid JSON"),
    "bytes not UTF-8": (_before('"treeguard.hash":', '"\udcff":"",'), "not UTF-8"),
    "a 21-digit offset": (
        lambda text: text.replace("[12,12]", "[12,123456789012345678901]"),
        "an integer of 21 digits",
    ),
    "a trailing comma": (lambda text: text[:-1] + ",}", "not valid JSON"),
    "text after the object": (lambda text: text + "x", "not valid JSON"),
    "two metadata": (_before('"__metadata__":', '"__metadata__":{},'), "appears twice"),
    "a metadata key twice": (
        _before('"treeguard.hash":', '"treeguard.hash":"sha256",'),
        "appears twice",
    ),
}


@pytest.mark.parametrize(("edit", "message"), _ODD.values(), ids=_ODD.keys())
def test_what_strict_json_refuses_is_refused_as_it_refuses_it(
    template: tuple[bytes, tg.Header], tmp_path: Path, edit: Callable[[str], str], message: str
) -> None:
    raw, _ = template
    n = int.from_bytes(raw[:8], "little")
    text = edit(raw[8 : 8 + n].decode().rstrip(" "))
    (tmp_path / "c.safetensors").write_bytes(_signed(text, raw[8 + n :]))
    with pytest.raises(tg.FormatError, match=message):
        tg.read_header(tmp_path / "c.safetensors")


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


@pytest.mark.slow  # 20,000 tensors saved and read under tracemalloc: about 15 s
def test_an_honest_header_is_read_within_its_budget(tmp_path: Path) -> None:
    tree = {f"block_{i:05d}": {"w": np.zeros((i % 3, 2), np.float32)} for i in range(20_000)}
    tg.save(tmp_path / "c.safetensors", tree)
    tg.read_header(tmp_path / "c.safetensors")  # every module it needs imported
    header, peak = _peak(lambda: tg.read_header(tmp_path / "c.safetensors"))
    assert header.tensors[5].shape == (2, 2)
    assert peak <= _budget(header.header_bytes)
