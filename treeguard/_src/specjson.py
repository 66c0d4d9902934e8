"""The JSON form of a ``TreeSpec`` (``treeguard.spec/1``): its encoder and its
strict decoder, which type-checks every field and names where a document goes
wrong. Numpy alone."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .errors import FormatError, InvalidTreeError
from .keydtype import dtype_name
from .leaf import Record, dtype_of
from .paths import Entry, Path, int_digits, keystr, short_repr
from .strictjson import MAX_INT_DIGITS
from .walk import LEAF, MAX_DEPTH, Node, key_problems

FORMAT = "treeguard.spec/1"
FORMAT_VERSION = 1
_FORMAT_RE = re.compile(r"^treeguard\.spec/(\d{1,9})$")
#: The largest size a spec's dimension may give (any real array is smaller).
MAX_DIM = 2**62


def encode(root: Node, records: Sequence[Record]) -> dict[str, Any]:
    """The JSON-ready document of a spec's structure and leaf records.

    Raises:
      InvalidTreeError: naming a dict key that JSON cannot hold.
    """
    return {
        "format": FORMAT,
        "num_leaves": len(records),
        "tree": _node_to_dict(root, iter(records), ()),
    }


def decode(data: Any) -> tuple[Node, list[Record]]:
    """The structure and leaf records of a spec document, read strictly.

    Raises:
      FormatError: for anything that is not a treeguard spec of a known
        version, naming where in the document it went wrong.
    """
    if not isinstance(data, dict):
        raise FormatError(f"a spec is a JSON object, not {type(data).__name__}")
    check_format(data.get("format"))
    if "tree" not in data:
        raise FormatError("spec has no 'tree'")
    records: list[Record] = []
    root = _node_from_dict(data["tree"], records, "tree", 0)
    declared = data.get("num_leaves")
    if declared is not None and (
        not isinstance(declared, int) or isinstance(declared, bool) or declared != len(records)
    ):
        raise FormatError(f"spec declares {declared!r} leaves but holds {len(records)}")
    problems = key_problems(root)
    if problems:
        where, what = problems[0]
        raise FormatError(f"tree{where}: {what}")
    return root, records


def check_format(fmt: Any) -> None:
    """Refuses a spec's ``format`` field unless it names this format at a
    version this reads.

    Raises:
      FormatError: saying what the field holds and what was expected.
    """
    m = _FORMAT_RE.match(fmt) if isinstance(fmt, str) else None
    if m is None:
        shown = fmt[:80] if isinstance(fmt, str) else type(fmt).__name__
        raise FormatError(f"not a treeguard spec: format is {shown!r}, expected {FORMAT!r}")
    if int(m.group(1)) > FORMAT_VERSION:
        raise FormatError(
            f"spec format {fmt!r} is newer than this treeguard reads ({FORMAT!r}); "
            "upgrade treeguard"
        )


_JSON_KEY_TYPES = (str, int, float, bool, type(None))


def _entry_to_json(entry: Entry, path: Path) -> list[Any]:
    kind, key = entry
    if not isinstance(key, _JSON_KEY_TYPES) or (isinstance(key, float) and not math.isfinite(key)):
        raise InvalidTreeError(
            [(keystr(path), f"key {key!r} of type {type(key).__name__} has no JSON form")],
            hint="use str or int keys in trees you save",
        )
    if type(key) is int and int_digits(key) > MAX_INT_DIGITS:
        raise InvalidTreeError(
            [(keystr(path), f"{kind} {short_repr(key)} is too long for a spec to read back")],
            hint=f"use str keys, or int keys of at most {MAX_INT_DIGITS} digits",
        )
    return [kind, key]


def _node_to_dict(node: Node, records: Iterable[Record], path: Path) -> dict[str, Any]:
    if node.kind == "leaf":
        shape, dtype, weak, sharding = next(iter(records))
        out: dict[str, Any] = {
            "kind": "leaf",
            "shape": list(shape),
            "dtype": dtype_name(dtype),
            "weak_type": weak,
        }
        if sharding is not None:
            out["sharding"] = sharding
        return out
    out = {"kind": node.kind}
    if node.kind in ("namedtuple", "custom"):
        out["type"] = node.type_name
    if node.kind == "custom":
        out["aux"] = node.aux
        if node.aux_repr is not None:
            out["aux_repr"] = node.aux_repr
    it = iter(records)
    out["children"] = [
        [_entry_to_json(e, path), _node_to_dict(c, it, (*path, e))]
        for e, c in zip(node.entries, node.children)
    ]
    return out


_KINDS = ("leaf", "none", "dict", "list", "tuple", "namedtuple", "custom")
_ENTRY_KINDS = ("key", "index", "attr", "flat")


def _node_from_dict(d: Any, records: list[Record], where: str, depth: int) -> Node:
    if not isinstance(d, dict):
        raise FormatError(f"{where}: a node is a JSON object, not {type(d).__name__}")
    if depth > MAX_DEPTH:
        raise FormatError(f"{where[:200]}...: the spec nests deeper than {MAX_DEPTH} containers")
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise FormatError(f"{where}: unknown node kind {short_repr(kind)}")
    if kind == "leaf":
        if "children" in d:
            raise FormatError(f"{where}: a leaf has no children")
        records.append(leaf_record(d, where))
        return LEAF
    children_raw = d.get("children", [])
    if not isinstance(children_raw, list):
        raise FormatError(f"{where}: children must be a list")
    if kind == "none" and children_raw:
        raise FormatError(f"{where}: a none node has no children")
    entries: list[Entry] = []
    children: list[Node] = []
    for i, item in enumerate(children_raw):
        at = f"{where}.children[{i}]"
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)):
            raise FormatError(f"{at}: expected [entry, node]")
        e = entry_from_json(item[0], kind, i, at)
        entries.append(e)
        children.append(_node_from_dict(item[1], records, f"{where}{keystr((e,))}", depth + 1))
    return container(
        kind, d.get("type", ""), d.get("aux"), d.get("aux_repr"), entries, children, where
    )


_BUILTIN = {
    "dict": "builtins.dict",
    "list": "builtins.list",
    "tuple": "builtins.tuple",
    "none": "builtins.NoneType",
}


def container(  # noqa: PLR0917 - a node's fields, in the order of Node's
    kind: str,
    type_name: Any,
    aux: Any,
    aux_repr: Any,
    entries: Sequence[Entry],
    children: Sequence[Node],
    where: str,
) -> Node:
    """A container node of a spec document, its type and ``aux_repr`` checked
    (its kind, entries and children were checked by the caller).

    Raises:
      FormatError: naming ``where`` for a type or ``aux_repr`` of the wrong type.
    """
    if kind in ("namedtuple", "custom") and (not isinstance(type_name, str) or not type_name):
        raise FormatError(f"{where}: type must be a non-empty string")
    if aux_repr is not None and not isinstance(aux_repr, str):
        raise FormatError(f"{where}: aux_repr must be a string or null")
    return Node(
        kind=kind,  # type: ignore[arg-type]  # checked against _KINDS by the caller
        type_name=_BUILTIN.get(kind, str(type_name or "")),
        aux=aux,
        aux_repr=aux_repr,
        entries=tuple(entries),
        children=tuple(children),
        num_leaves=sum(c.num_leaves for c in children),
    )


def leaf_record(d: dict[str, Any], where: str) -> Record:
    """A leaf's record, every field type-checked.

    Raises:
      FormatError: naming ``where`` and the field.
    """
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(
        (isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DIM)
        or (isinstance(x, str) and x)
        for x in shape
    ):
        raise FormatError(f"{where}: bad shape {short_repr(shape)}")
    dtype = leaf_dtype(d.get("dtype"), where)
    weak = d.get("weak_type")
    if weak is not None and not isinstance(weak, bool):
        raise FormatError(f"{where}: weak_type must be true, false or null")
    sharding = d.get("sharding")
    if sharding is not None and not isinstance(sharding, str):
        raise FormatError(f"{where}: sharding must be a string")
    return (tuple(shape), dtype, weak, sharding)


def leaf_dtype(text: Any, where: str) -> np.dtype[Any]:
    """A leaf's ``dtype`` field read: a name of a dtype of native byte order.

    Raises:
      FormatError: naming ``where``, for a field of another type, a name of
        no dtype or a dtype of non-native byte order.
    """
    if text is not None and not isinstance(text, str):
        raise FormatError(f"{where}: dtype must be a string, not {type(text).__name__}")
    dtype = dtype_of(text)
    if not dtype.isnative:
        raise FormatError(
            f"{where}: dtype {str(text)[:20]!r} has non-native byte order; a spec names dtypes "
            "by name (float32), stored in native order"
        )
    return dtype


#: The entry kind each container kind's children carry.
_CHILD_KINDS = {
    "dict": ("key",),
    "list": ("index",),
    "tuple": ("index",),
    "namedtuple": ("attr",),
    "custom": _ENTRY_KINDS,
}


def entry_from_json(entry: list[Any], kind: str, i: int, at: str) -> Entry:
    """A child's key entry, checked against its container's kind and place.

    Raises:
      FormatError: naming ``at``.
    """
    if len(entry) != 2 or entry[0] not in _CHILD_KINDS.get(kind, ()):
        raise FormatError(f"{at}: bad key entry {short_repr(entry)} for a {kind} node")
    ekind, key = entry
    if ekind in ("index", "flat") and (not isinstance(key, int) or isinstance(key, bool)):
        raise FormatError(f"{at}: index must be an integer")
    if kind in ("list", "tuple") and key != i:
        raise FormatError(f"{at}: child {i} of a {kind} has index {key}")
    if ekind == "attr" and not isinstance(key, str):
        raise FormatError(f"{at}: attribute must be a string")
    if isinstance(key, (list, dict)):
        raise FormatError(f"{at}: key {short_repr(key)} is not hashable")
    return (ekind, key)
