"""A stored spec's JSON text read straight into its ``Node`` tree and leaf
records, each costed before it is built.

``json.loads`` of a spec builds a dict per node, two lists per child and a
string per key and kind, and ``specjson.decode`` then builds the ``Node``
tree and records beside them: together several times the text. ``scan``
reads the form ``TreeSpec.to_json`` writes (keys sorted, ``", "`` and
``": "`` between them) with a few regular expressions, one match per child:
each key string is interned, each leaf's fields are read from its match
(its sizes as integers, its dtype once per name) into a record (a tuple of
shape, dtype, weak type and sharding) shared by every equal leaf, and what
each object costs is added to the total before it is built, so a spec that
would cost more than its budget is given up before it does. The memos that
share key strings and records hold at most ``MEMO_SIZE`` each: a spec whose
every leaf or key is its own pays for no slot past them.

``scan`` never refuses a spec: anything else (another key order or spacing,
a key of a type other than a string or an integer, a field of a wrong
type, a key that reads back as another) returns None, and the caller reads
it with ``strictjson.loads`` and ``specjson.decode``, which refuse exactly
what they refused before.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import numpy as np

from .errors import FormatError
from .leaf import Record, Shape
from .specjson import MAX_DIM, check_format, container, entry_from_json, leaf_dtype, leaf_record
from .strictjson import MAX_DEPTH as STRICT_DEPTH
from .strictjson import MAX_INT_DIGITS, loads
from .strictjson import Shape as Measure
from .walk import LEAF, MAX_DEPTH, Node, keys_ascending, node_key_problems

_STR = r'"[^"\\\x00-\x1f]*+(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*+)*+"'
_INT = rf"-?(?:0|[1-9][0-9]{{0,{MAX_INT_DIGITS - 1}}})(?![0-9.eE])"
_ROOT = re.compile(rf'\{{"format": ({_STR}), "num_leaves": ({_INT}), "tree": ')
_ENTRY_KINDS = ("key", "index", "attr", "flat")
_CONTAINER_KINDS = ("dict", "list", "tuple", "namedtuple", "custom", "none")
_CHILD = re.compile(rf'\[\["({"|".join(_ENTRY_KINDS)})", ({_STR}|{_INT})\], ')
_LEAF = re.compile(
    rf'\{{"dtype": ({_STR}), "kind": "leaf", "shape": \[((?:[^\]"]|{_STR})*+)\]'
    rf'(?:, "sharding": ({_STR}))?, "weak_type": (true|false|null)\}}'
)
#: A shape's sizes as ``to_json`` writes them: plain integers of at most
#: ``MAX_INT_DIGITS`` digits (any other is read from the leaf's JSON).
_SIZE = rf"(?:0|[1-9][0-9]{{0,{MAX_INT_DIGITS - 1}}})"
_SIZES = re.compile(rf"(?:{_SIZE}(?:, {_SIZE})*)?")
_WEAK = {"true": True, "false": False, "null": None}
_AUX = re.compile(r'\{"aux": ')
_AUX_REPR = re.compile(rf', "aux_repr": ({_STR})')
_CHILDREN = re.compile(r'\{"children": \[')
_AUX_CHILDREN = re.compile(r', "children": \[')
_CLOSE = re.compile(rf'\], "kind": "({"|".join(_CONTAINER_KINDS)})"(?:, "type": ({_STR}))?\}}')
_SCALAR = re.compile(rf"{_STR}|-?[0-9][0-9.eE+-]*|true|false|null")
_BRACKET = re.compile(rf"{_STR}|[\[\]{{}}]")
#: Each entry's and node's kind, one string each (a match's group is a new one).
_KINDS = {k: k for k in (*_ENTRY_KINDS, *_CONTAINER_KINDS)}

# -- what each object costs (CPython 3.11, 64-bit; upper bounds) ----------------

#: A ``str`` past its characters (ASCII, and not: up to 4 bytes a character),
#: a slot of a dict at its fullest, a tuple past its slots and an ``int``.
ASCII_STR_COST, STR_COST, DICT_SLOT_COST, TUPLE_COST, INT_COST = 56, 80, 72, 40, 36
#: Per child: what stays (its ``(kind, key)`` tuple and its slots in its
#: node's two tuples) and what is held only until its node is built (its
#: slots in the frame's two lists, each grown by an eighth past full).
CHILD_COST, CHILD_HELD = TUPLE_COST + 16 + 2 * 8, 2 * 2 * 8
#: A leaf's slot in the records (a list grown by an eighth past full).
RECORD_SLOT_COST = 16
#: A container's ``Node`` and its two tuples; the frame that collects its
#: children while it is read; what keeping a node to share costs (its key
#: tuple and a slot of a dict).
NODE_COST = sys.getsizeof(LEAF) + 2 * TUPLE_COST
FRAME_COST, SHARED_COST = 80 + 2 * 56, 72 + 72
#: A leaf's record: its tuple of four.
RECORD_COST = TUPLE_COST + 4 * 8
#: How many distinct records, key strings and shardings a scan keeps to
#: share with the equal ones read after them (a slot of a dict each); each
#: new one past them is built on its own and costs only itself, so a spec of
#: leaves or keys each of its own pays no slot for each (models repeat a few
#: hundred at most).
MEMO_SIZE = 1 << 12
#: A dtype read from a name: numpy's own dtypes are one object each, a key
#: dtype may be a new one (kept once per name, with its name and its slot).
DTYPE_COST = 200


def _str_cost(text: str) -> int:
    """The most a ``str`` of ``text``'s characters takes."""
    return ASCII_STR_COST + len(text) if text.isascii() else STR_COST + 4 * len(text)


def _string(token: str) -> str | None:
    """A string token decoded; None where ``strictjson`` must say what is
    wrong with it (a bad escape, a lone surrogate)."""
    if "\\" not in token:
        return token[1:-1]
    try:
        text: str = json.loads(token)
        text.encode("utf-8")  # UnicodeEncodeError for a lone surrogate
    except (UnicodeError, ValueError):
        return None
    return text


class _Frame:
    """A container node while its children are read."""

    __slots__ = ("aux", "aux_repr", "children", "entries", "strings")

    def __init__(self, aux: Any, aux_repr: str | None, strings: int) -> None:
        self.aux, self.aux_repr = aux, aux_repr
        self.strings = strings  # how many key strings were new when it opened
        self.entries: list[Any] = []  # (kind, key) tuples, checked when the node is built
        self.children: list[Node] = []


class _Over(Exception):
    """The spec is not of the usual form, or over its budget: the caller reads it as JSON."""


class _SpecScan:
    """One spec's scan: the records and strings built so far and what they cost."""

    def __init__(self, text: str, budget: int) -> None:
        self.text, self.budget, self.cost = text, budget, 0
        self.records: list[Record] = []
        self.kept_records: dict[Record, Record] = {}  # each distinct record kept once
        self.dtypes: dict[str, np.dtype[Any]] = {}  # a dtype's token -> the dtype
        self.leaf_strings: dict[str, str] = {}  # a sharding's token -> its text
        self.strings: dict[str, str] = {}  # each key string kept once
        self.new_strings = 0  # key strings found in no memo: read for the first time, or not kept
        self.nodes: dict[tuple[Any, ...], Node] = {}  # each container kept once

    def charge(self, cost: int) -> None:
        self.cost += cost
        if self.cost > self.budget:
            raise _Over

    def match(self, pattern: re.Pattern[str], pos: int) -> re.Match[str]:
        m = pattern.match(self.text, pos)
        if m is None:
            raise _Over
        return m

    def leaf(self, m: re.Match[str]) -> None:
        """Adds the record of the leaf ``m`` matched (``_LEAF``): one tuple
        shared by every equal leaf, its dtype and sharding kept once each."""
        self.charge(RECORD_SLOT_COST)
        dtype_token, sizes, sharding_token, weak = m.groups()
        shape: Shape | None = _sizes(sizes)
        if shape is None:  # a symbolic size, or sizes spaced otherwise
            shape, dtype, _, sharding = self.leaf_json(m.group())  # its weak_type as matched
        else:
            dtype = self.dtype(dtype_token)
            sharding = None if sharding_token is None else self.leaf_string(sharding_token)
        held = _shape_cost(shape)
        self.charge(held)
        record = (shape, dtype, _WEAK[weak], sharding)
        kept = self.kept_records.get(record)
        if kept is not None:  # ``record`` and its shape dropped
            self.cost -= held
            record = kept
        elif len(self.kept_records) < MEMO_SIZE:
            self.charge(RECORD_COST + DICT_SLOT_COST)
            self.kept_records[record] = record
        else:
            self.charge(RECORD_COST)
        self.records.append(record)

    def leaf_json(self, text: str) -> Record:
        """The record of a leaf's ``text`` read as JSON (its sizes as they
        come), its dtype and sharding costed as its own."""
        doc_cost = Measure.of(text).cost  # held only while the record is built
        if self.cost + doc_cost > self.budget:
            raise _Over
        try:  # the strings checked as strictjson checks them
            record = leaf_record(loads(text, "leaf"), "")
        except FormatError:
            raise _Over from None
        sharding = record[3]
        self.charge(DTYPE_COST + (0 if sharding is None else _str_cost(sharding)))
        return record

    def dtype(self, token: str) -> np.dtype[Any]:
        """The dtype a leaf's ``dtype`` token names, read once per token."""
        dtype = self.dtypes.get(token)
        if dtype is None:
            self.charge(_str_cost(token) + DICT_SLOT_COST + DTYPE_COST)
            name = _string(token)
            try:
                if name is None:
                    raise _Over
                dtype = self.dtypes[token] = leaf_dtype(name, "")
            except FormatError:
                raise _Over from None
        return dtype

    def leaf_string(self, token: str) -> str:
        """A leaf's sharding token decoded, kept once however often it is read."""
        text = self.leaf_strings.get(token)
        if text is None:
            text = _string(token)
            if text is None:
                raise _Over
            if len(self.leaf_strings) < MEMO_SIZE:
                self.charge(_str_cost(token) + _str_cost(text) + DICT_SLOT_COST)
                self.leaf_strings[token] = text
            else:
                self.charge(_str_cost(text))
        return text

    def entry(self, pos: int) -> tuple[tuple[str, Any], int]:
        """A child's ``[kind, key]`` at ``pos``, its key string interned."""
        m = self.match(_CHILD, pos)
        kind, token = _KINDS[m.group(1)], m.group(2)
        self.charge(CHILD_COST + CHILD_HELD)
        if token[0] != '"':
            key = int(token)
            if not -5 <= key <= 256:  # CPython keeps one of each of those
                self.charge(INT_COST)
            return (kind, key), m.end()
        return (kind, self.string(token)), m.end()

    def string(self, token: str) -> str:
        """A string token decoded, kept once however often it is read."""
        text = _string(token)
        if text is None:
            raise _Over
        if (kept := self.strings.get(text)) is None:
            self.new_strings += 1
            if len(self.strings) < MEMO_SIZE:
                self.charge(_str_cost(text) + DICT_SLOT_COST)
                kept = self.strings[text] = text
            else:
                self.charge(_str_cost(text))
                kept = text
        return kept

    def open(self, pos: int, depth: int) -> tuple[_Frame, int]:
        """A container's fields before its children (``aux``, ``aux_repr``),
        ``depth`` containers below the root."""
        self.charge(NODE_COST + FRAME_COST)
        aux, aux_repr = None, None
        if (m := _AUX.match(self.text, pos)) is not None:
            # the value nests in the node's object, itself 2 + 3 * depth deep
            end = self.value_end(m.end(), STRICT_DEPTH - 3 - 3 * depth)
            piece = self.text[m.end() : end]
            self.charge(_str_cost(piece) + Measure.of(piece).cost)
            try:
                aux = loads(piece, "aux")
            except FormatError:
                raise _Over from None
            pos = end
            if (r := _AUX_REPR.match(self.text, pos)) is not None:
                aux_repr = _string(r.group(1))
                if aux_repr is None:
                    raise _Over
                self.charge(_str_cost(aux_repr))
                pos = r.end()
        children = self.match(_CHILDREN if m is None else _AUX_CHILDREN, pos)
        return _Frame(aux, aux_repr, self.new_strings), children.end()

    def value_end(self, pos: int, deepest: int) -> int:
        """Where the JSON value at ``pos`` ends (its brackets and strings
        matched, no object built), if it nests at most ``deepest`` deep."""
        if self.text[pos : pos + 1] not in ("[", "{"):
            return self.match(_SCALAR, pos).end()
        depth = 0
        for m in _BRACKET.finditer(self.text, pos):
            token = m.group()
            if token in "[{":
                depth += 1
                if depth > deepest:
                    raise _Over
            elif token in "]}":
                depth -= 1
                if depth == 0:
                    return m.end()
        raise _Over

    def close(self, frame: _Frame, pos: int) -> tuple[Node, int]:
        """The node whose children end at ``pos`` (its ``]``)."""
        m = self.match(_CLOSE, pos)
        kind, type_token = _KINDS[m.group(1)], m.group(2)
        type_name = "" if type_token is None else self.string(type_token)
        entries = frame.entries
        try:
            for i, e in enumerate(entries):
                entry_from_json(e, kind, i, "")  # an equal tuple: ``e`` is kept
            if kind == "none" and entries:
                raise _Over
            node = container(
                kind, type_name, frame.aux, frame.aux_repr, entries, frame.children, ""
            )
        except FormatError:
            raise _Over from None
        self.cost -= FRAME_COST + CHILD_HELD * len(entries)
        # a key string below it found in no memo: no node kept before is equal
        fresh = self.new_strings > frame.strings
        return self.shared(node, fresh), m.end()

    def shared(self, node: Node, fresh: bool) -> Node:
        """The first node read equal to ``node`` (of the same kind and type,
        equal keys and the very same children), or ``node``, kept to share
        unless it is ``fresh`` (none can be equal to it)."""
        if fresh or node.aux is not None or node.aux_repr is not None:
            self.check_keys(node)
            return node
        key = (node.kind, node.type_name, node.entries, node.children)
        found = self.nodes.get(key)
        if found is not None:  # ``node``, its tuples and its entries dropped
            self.cost -= NODE_COST + CHILD_COST * len(node.entries)
            return found
        self.check_keys(node)
        self.charge(SHARED_COST)
        self.nodes[key] = node
        return node

    def check_keys(self, node: Node) -> None:
        """Gives up a node whose keys would not read back from tensor names
        (``walk.node_key_problems``, which holds each key's text and each
        key in a dict while it looks, or, for keys in ascending order, one
        key's text at a time)."""
        if keys_ascending(node.entries):
            held = max((_key_text_cost(e[1]) for e in node.entries), default=0)
        else:
            held = sum(2 * DICT_SLOT_COST + _key_text_cost(e[1]) for e in node.entries)
        self.charge(held)
        if node_key_problems(node):
            raise _Over
        self.cost -= held

    def tree(self, pos: int) -> tuple[Node, int]:
        """The node at ``pos`` and all below it, and where it ends."""
        text, stack = self.text, list[_Frame]()
        while True:
            if len(stack) > MAX_DEPTH:  # as specjson.decode counts, the root at 0
                raise _Over
            if (m := _LEAF.match(text, pos)) is not None:
                self.leaf(m)
                node, pos = LEAF, m.end()
            else:
                frame, pos = self.open(pos, len(stack))
                stack.append(frame)
                if not text.startswith("]", pos):
                    entry, pos = self.entry(pos)
                    frame.entries.append(entry)
                    continue
                node, pos = self.close(stack.pop(), pos)
            while stack:  # the node just read is its parent's last child so far
                frame = stack[-1]
                frame.children.append(node)
                if not text.startswith("]", pos):
                    raise _Over
                if text.startswith(", ", pos + 1):
                    entry, pos = self.entry(pos + 3)
                    frame.entries.append(entry)
                    break
                node, pos = self.close(stack.pop(), pos + 1)
            else:
                return node, pos


def _key_text_cost(key: Any) -> int:
    """The most the text of a key entry (``['a']``, ``repr`` of its key) takes."""
    text = str(key)
    if text.isascii():  # a control character's escape is 4 characters
        return ASCII_STR_COST + 8 + 4 * len(text)
    return STR_COST + 4 * (8 + 10 * len(text))


def _sizes(text: str) -> tuple[int, ...] | None:
    """A shape's sizes read from the text between its brackets, where they
    are plain integers as ``to_json`` writes them; None where they are not.

    Raises:
      _Over: for a size the strict reader refuses (past ``MAX_DIM``).
    """
    if _SIZES.fullmatch(text) is None:
        return None
    sizes = tuple(int(d) for d in text.split(", ")) if text else ()
    if any(d > MAX_DIM for d in sizes):
        raise _Over
    return sizes


def _shape_cost(shape: tuple[Any, ...]) -> int:
    """The most a shape's tuple and its sizes take (CPython keeps one of
    each int from -5 to 256)."""
    cost = TUPLE_COST + 8 * len(shape)
    for d in shape:
        if isinstance(d, str):
            cost += _str_cost(d)
        elif not -5 <= d <= 256:
            cost += INT_COST
    return cost


def scan(text: str, budget: int) -> tuple[Node, list[Record], int] | None:
    """A spec's structure and leaf records read from its text, in at most
    ``budget`` bytes of objects, and what they cost; None for a spec of
    another form or cost (the caller reads it with ``strictjson.loads``).

    Example:
      >>> text = ('{"format": "treeguard.spec/1", "num_leaves": 1, "tree": {"children": '
      ...         '[[["key", "w"], {"dtype": "float32", "kind": "leaf", "shape": [2], '
      ...         '"weak_type": false}]], "kind": "dict"}}')
      >>> root, records, cost = scan(text, 100_000)
      >>> root.kind, records[0][0], records[0][1].name
      ('dict', (2,), 'float32')
      >>> scan(text.replace(", ", ","), 100_000) is None
      True
    """
    state = _SpecScan(text, budget)
    try:
        m = state.match(_ROOT, 0)
        fmt = _string(m.group(1))
        check_format(fmt)
        root, pos = state.tree(m.end())
        if pos != len(text) - 1 or text[pos] != "}" or int(m.group(2)) != len(state.records):
            raise _Over
    except (_Over, FormatError):
        return None
    return root, state.records, state.cost + sys.getsizeof(state.records)
