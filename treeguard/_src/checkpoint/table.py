"""Reading a safetensors header's bytes into compact records, costed first.

``json.loads`` turns each tensor entry into a dict, two lists and their
numbers (about 400 bytes for 60 of text) and needs the header decoded into
one ``str`` beside its bytes. ``scan`` reads a header of the form every
safetensors writer produces (``__metadata__``, a map of strings, and entries
``{"dtype": ..., "shape": [...], "data_offsets": [a, b]}``, their fields in
that order or any other) straight from its bytes: each entry becomes an
``Entry`` (its dtype name
interned, its shape a tuple shared by every entry of that shape), each name
and metadata string is decoded once, and what each record will cost is
computed from its bytes before it is built, so a table that would cost more
than its budget is given up before it does.

``entries_past`` counts the entries ``scan`` would read, by the same
grammar and building nothing, so that a header of too many is refused
before a record is made of any.

``scan`` never refuses a header: anything else (another field, a
duplicate key, an escape it cannot decode, a table over its budget) returns
None, and the caller parses the header with ``strictjson.loads``, which
refuses exactly what it refused before, under the same budget.
"""

from __future__ import annotations

import functools
import itertools
import json
import mmap
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, TypeAlias

from .format import FOREIGN, NATIVE

#: What a header's bytes are read into: ``bytes``, or the anonymous mapping
#: ``files.read_raw_header`` reads them into (handed back to the system
#: when it is closed, so no freed heap outlives the read).
Buffer: TypeAlias = bytes | bytearray | mmap.mmap


class Entry(NamedTuple):
    """A tensor entry of the usual form (a dtype name, a shape and two
    offsets, all of the JSON types they should be) in a third of the memory
    of its dict."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def expanded(entry: Any) -> Any:
    """An entry as the header holds it: an ``Entry`` back as its dict; any
    other value as it is.

    Example:
      >>> expanded(Entry("F32", (2,), 0, 8))
      {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}
    """
    if isinstance(entry, Entry):
        return {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [entry.begin, entry.end],
        }
    return entry


class Expanded(Mapping[str, Any]):
    """A tensor table whose ``Entry`` values read as the dicts the header
    holds, one at a time (for ``header_digest``'s canonical text)."""

    def __init__(self, table: Mapping[str, Any]) -> None:
        self._table = table

    def __getitem__(self, key: str) -> Any:
        return expanded(self._table[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


#: The stored dtype names, so that each entry's names share one string.
STORED_NAMES = {n: n for n in (*NATIVE.values(), *FOREIGN)}
_DTYPE_BYTES = {n.encode(): n for n in STORED_NAMES}

# -- the grammar (bytes; JSON's blanks, strings and integers) --------------------

_WS = rb"[ \t\n\r]*+"
#: A string token: no control character, a backslash and the character after
#: it taken together (``json.loads`` of the token checks the escape itself).
_STR = rb'"[^"\\\x00-\x1f]*+(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*+)*+"'
#: A non-negative integer of at most ``strictjson.MAX_INT_DIGITS`` digits.
_INT = rb"(?:0|[1-9][0-9]{0,19})(?![0-9.eE])"
_DIMS = rb"\[" + _WS + rb"(?:" + _INT + _WS + rb"(?:," + _WS + _INT + _WS + rb")*+)?\]"


def _pair(key: bytes, value: bytes) -> bytes:
    return key + _WS + rb":" + _WS + value


#: An entry's three fields, each a named group, in the order they are matched.
_FIELDS = {
    b"dtype": _pair(rb'"dtype"', rb'"(?P<dtype>[A-Za-z0-9_]{1,32})"'),
    b"shape": _pair(rb'"shape"', rb"(?P<dims>" + _DIMS + rb")"),
    b"data_offsets": _pair(
        rb'"data_offsets"',
        rb"\[" + _WS + rb"(?P<begin>" + _INT + rb")" + _WS + rb"," + _WS
        + rb"(?P<stop>" + _INT + rb")" + _WS + rb"\]",
    ),
}  # fmt: skip


def _entry(order: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """An entry whose fields come in ``order``, and the byte after it."""
    fields = (_WS + rb"," + _WS).join(_FIELDS[key] for key in order)
    head = _WS + _pair(rb"(?P<token>" + _STR + rb")", rb"\{" + _WS)
    return re.compile(head + fields + _WS + rb"\}" + _WS + rb"(?P<last>[,}])")


#: The usual order (every safetensors writer's); the five others are
#: compiled when an entry first needs them (``_other_orders``).
_USUAL = _entry(tuple(_FIELDS))
_GROUPS = ("token", "dtype", "dims", "begin", "stop", "last")


@functools.cache
def _other_orders() -> tuple[re.Pattern[bytes], ...]:
    return tuple(map(_entry, itertools.permutations(_FIELDS)))[1:]


_STRINGS = _STR + _WS + rb":" + _WS + _STR
_META = re.compile(
    _WS
    + _pair(rb'"__metadata__"', rb"\{" + _WS)
    + (rb"((?:" + _STRINGS + _WS + rb"(?:," + _WS + _STRINGS + _WS + rb")*+)?)")
    + (rb"\}" + _WS + rb"([,}])")
)
_TOKEN = re.compile(_STR)
_OPEN = re.compile(_WS + rb"\{")
_EMPTY = re.compile(_WS + rb"\}")
_END = re.compile(rb"[ \t\n\r]*")
_NON_ASCII = re.compile(rb"[\x80-\xff]")

# -- what each record costs (CPython 3.11, 64-bit; upper bounds) -----------------

#: An ``Entry``, and a slot of the table's dict at its fullest (a dict peaks
#: below 66 bytes an item while it grows, the old table and the new at once).
ENTRY_COST = sys.getsizeof(Entry("", (), 0, 0))
DICT_SLOT_COST = 72
#: A ``str`` past its characters: ASCII, and not (up to 4 bytes a character).
ASCII_STR_COST, STR_COST = sys.getsizeof(""), 80
TUPLE_COST, SLOT_COST = sys.getsizeof(()), 8
#: A dict of a few keys, and a ``bytes`` past its bytes (a shape's key).
DICT_COST, BYTES_COST = 240, sys.getsizeof(b"")


#: An ``int`` of so many digits: none below 100 (CPython keeps one of each).
_INT_COSTS = (0, 0, 0, *[28] * 7, *[32] * 9, *[36] * 2)


def _str_cost(raw: Buffer, start: int, end: int) -> int:
    """The most a ``str`` decoded from the string token at ``start:end`` takes."""
    if _NON_ASCII.search(raw, start, end) is None:
        return ASCII_STR_COST + end - start
    return STR_COST + 4 * (end - start)


def _name(token: bytes) -> str | None:
    """A (short) string token decoded, or None as ``_decoded`` says."""
    try:
        if b"\\" not in token:
            return token[1:-1].decode()
        text: str = json.loads(token)
        text.encode("utf-8")  # UnicodeEncodeError for a lone surrogate
        return text
    except (UnicodeError, ValueError):
        return None


def _decoded(raw: Buffer, start: int, end: int) -> str | None:
    """The string token at ``start:end`` decoded, or None where
    ``strictjson.loads`` must say what is wrong with it (not UTF-8, a bad
    escape, a lone surrogate)."""
    view = memoryview(raw)[start:end]
    try:
        if raw.find(b"\\", start, end) < 0:
            return str(view[1:-1], "utf-8")
        text: str = json.loads(str(view, "utf-8"))
        text.encode("utf-8")  # UnicodeEncodeError for a lone surrogate
        return text
    except (UnicodeError, ValueError):
        return None
    finally:
        view.release()


def _sizes(dims: bytes) -> list[bytes]:
    """The sizes of a shape's token (``[2, 3]``), blanks and all."""
    return dims[1:-1].split(b",") if dims.strip(b"[ \t\n\r]") else []


class _Scan:
    """One header's scan: the table built so far and what it costs."""

    def __init__(self, raw: Buffer, budget: int) -> None:
        self.raw, self.budget = raw, budget
        self.doc: dict[str, Any] = {}
        self.shapes: dict[bytes, tuple[int, ...]] = {}
        self.cost = DICT_COST

    def entries(self, pos: int) -> tuple[int, bytes | None]:
        """Adds the entries from ``pos`` on, as long as they are of the
        usual form; the position after them and the byte that ended the last
        (``,`` or ``}``; None past the last such entry); a position of -1
        where ``strictjson`` must read the header."""
        raw, doc, shapes, usual = self.raw, self.doc, self.shapes, _USUAL.match
        ascii_all, last = _NON_ASCII.search(raw) is None, None
        while (m := usual(raw, pos) or _other_order(raw, pos)) is not None:
            token, dtype, dims, begin, stop, last = m.group(*_GROUPS)
            cost = ASCII_STR_COST + len(token) + ENTRY_COST + DICT_SLOT_COST
            if not ascii_all and not token.isascii():
                cost += STR_COST + 3 * len(token)
            cost += _INT_COSTS[len(begin)] + _INT_COSTS[len(stop)]
            if (shape := shapes.get(dims)) is None:
                cost += self.shape_cost(dims)
            if (dtype_name := _DTYPE_BYTES.get(dtype)) is None:
                cost += ASCII_STR_COST + len(dtype)
            self.cost += cost
            if self.cost > self.budget:
                return -1, None
            if shape is None:
                shape = shapes[dims] = self.shape(dims)
            name = _name(token)
            if name is None or name in doc:
                return -1, None
            doc[name] = Entry(dtype_name or dtype.decode(), shape, int(begin), int(stop))
            pos = m.end()
            if last == b"}":
                break
        return pos, last

    @staticmethod
    def shape_cost(dims: bytes) -> int:
        """What a new shape costs: its tuple, its sizes and its place in the cache."""
        sizes = _sizes(dims)
        cost = BYTES_COST + len(dims) + DICT_SLOT_COST + TUPLE_COST
        return cost + sum(SLOT_COST + _INT_COSTS[len(d.strip())] for d in sizes)

    @staticmethod
    def shape(dims: bytes) -> tuple[int, ...]:
        return tuple(int(d) for d in _sizes(dims))

    def metadata(self, m: re.Match[bytes]) -> bool:
        """Adds ``__metadata__``, a map of strings, as ``m`` matched it;
        False where ``strictjson`` must read it."""
        if "__metadata__" in self.doc:
            return False
        start, end = m.span(1)
        strings, cost, most = 0, 0, 0  # each string is held twice while an escaped one is decoded
        for token in _TOKEN.finditer(self.raw, start, end):
            one = _str_cost(self.raw, *token.span())
            strings, cost, most = strings + 1, cost + one, max(most, one)
        self.cost += DICT_COST + DICT_SLOT_COST * (1 + strings) + cost + most
        if self.cost > self.budget:
            return False
        meta: dict[str, str] = {}
        tokens = _TOKEN.finditer(self.raw, start, end)
        for k, v in zip(tokens, tokens):
            key, value = _decoded(self.raw, *k.span()), _decoded(self.raw, *v.span())
            if key is None or value is None or key in meta:
                return False
            meta[key] = value
        self.doc["__metadata__"] = meta
        return True


def scan(raw: Buffer, budget: int) -> dict[str, Any] | None:
    """A safetensors header read from its bytes into ``Entry`` records, in
    at most ``budget`` bytes of objects; None for a header of another form
    or cost (the caller parses it with ``strictjson.loads``).

    Example:
      >>> scan(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 10_000)
      {'w': Entry(dtype='F32', shape=(2,), begin=0, end=8)}
      >>> scan(b'{"w":{"shape":[2],"dtype":"F32","data_offsets":[0,8]}}', 10_000)
      {'w': Entry(dtype='F32', shape=(2,), begin=0, end=8)}
      >>> scan(b'{"w":{"shape":[2],"dtype":"F32","data_offsets":[0,8],"x":1}}', 10_000) is None
      True
    """
    opening = _OPEN.match(raw)
    if opening is None:
        return None
    state, pos = _Scan(raw, budget), opening.end()
    if (empty := _EMPTY.match(raw, pos)) is not None:
        pos = empty.end()
    else:
        while True:
            pos, last = state.entries(pos)
            if pos < 0:
                return None
            if last is None:
                if (m := _META.match(raw, pos)) is None or not state.metadata(m):
                    return None
                pos, last = m.end(), m.group(2)
            if last == b"}":
                break
    return state.doc if _blank_to_end(raw, pos) else None


#: A key every entry ``scan`` reads holds, as these bytes: no string token holds
#: them but at its end (a quote inside one is escaped), so they are counted alike.
_OFFSETS_KEY = b'"data_offsets"'
#: The shortest entry ``scan`` reads, with the byte after it.
_SHORTEST_ENTRY = len(b'"":{"dtype":"X","shape":[],"data_offsets":[0,0]},')


def entries_past(raw: Buffer, most: int) -> bool:
    """Whether ``scan`` would read more than ``most`` entries from ``raw``:
    counted by its grammar alone, stopping at the first past ``most``, no name
    decoded and no record built. Only bytes that could hold so many entries
    are matched at all: enough of them for that many of the shortest entry,
    holding the key ``"data_offsets"`` more than ``most`` times.

    Example:
      >>> entry = b'"w%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'
      >>> raw = b"{" + b",".join(entry % i for i in range(3)) + b"}"
      >>> entries_past(raw, 2), entries_past(raw, 3)
      (True, False)
    """
    if len(raw) <= most * _SHORTEST_ENTRY or not _holds_more(raw, _OFFSETS_KEY, most):
        return False
    opening = _OPEN.match(raw)
    if opening is None:
        return False
    pos, count = opening.end(), 0
    while count <= most:
        m = _USUAL.match(raw, pos) or _other_order(raw, pos)
        if m is None:
            m = _META.match(raw, pos)
            if m is None:
                return False  # the scan stops here too, and so would count no more
        else:
            count += 1
        pos = m.end()
        if raw[pos - 1 : pos] == b"}":  # each pattern ends with the byte after its value
            return count > most
    return True


def _holds_more(raw: Buffer, token: bytes, most: int) -> bool:
    """Whether ``raw`` holds ``token`` more than ``most`` times (an ``mmap``
    has no ``count``)."""
    at, found = raw.find(token), 0
    while at >= 0:
        found += 1
        if found > most:
            return True
        at = raw.find(token, at + len(token))
    return False


def _other_order(raw: Buffer, pos: int) -> re.Match[bytes] | None:
    """An entry at ``pos`` whose fields come in another order, or None."""
    for pattern in _other_orders():
        if (m := pattern.match(raw, pos)) is not None:
            return m
    return None


def held_cost(table: Mapping[str, Any], meta: Mapping[str, str]) -> int:
    """The bytes a header read holds: its table (each ``Entry``, each
    distinct shape once; any other value whole) and its metadata's strings.

    Example:
      >>> held_cost({}, {}) == 2 * sys.getsizeof({})
      True
    """
    cost = sys.getsizeof(table) + sys.getsizeof(meta)
    cost += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in meta.items())
    shapes: set[int] = set()
    for name, entry in table.items():
        cost += sys.getsizeof(name)
        if type(entry) is not Entry:
            cost += _deep_size(entry)
            continue
        cost += ENTRY_COST + sys.getsizeof(entry.begin) + sys.getsizeof(entry.end)
        if id(entry.shape) not in shapes:
            shapes.add(id(entry.shape))
            cost += _deep_size(entry.shape)
    return cost


def _deep_size(value: Any) -> int:
    """The bytes of a JSON value and all it holds (shared parts counted each time)."""
    cost, stack = 0, [value]
    while stack:
        v = stack.pop()
        cost += sys.getsizeof(v)
        if isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return cost


def _blank_to_end(raw: Buffer, pos: int) -> bool:
    """Whether only blanks follow ``pos``."""
    return _END.fullmatch(raw, pos) is not None
