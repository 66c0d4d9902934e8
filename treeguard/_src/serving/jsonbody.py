"""A JSON request body parsed in memory bounded by its size.

``json.loads`` builds a Python object for every value: a float costs 32 bytes
for the 4 of ``0.5,``, an empty object 64 or more for the 3 of ``{},``, so a
1 MiB body can cost 20 MiB before any check sees it. ``split`` scans a
body's bytes first (C-speed regular expressions and counts, no Python
object per value):

- each input's flat ``data`` list of numbers, or of booleans, is cut out of
  the text and kept as a ``Numbers`` span of the body, which the decoder
  turns into an array of the input's dtype a chunk at a time, never one
  Python number per element;
- what is left (names, shapes, parameters, anything else) is counted, and
  refused with a 413 when the objects JSON parsing would build for it could
  cost more than ``COST_PER_BYTE`` times the body (past a fixed
  ``FREE_COST``), before any is built.

A span stands in the remaining text as a number token no client can write
(it carries a per-process nonce), so the strict parse of the rest keeps every
rule and every message: a duplicate key, ``NaN``, a syntax error or a bad
UTF-8 byte is refused exactly as when the whole body is parsed at once.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

#: Bodies up to this size are parsed whole: at most this many bytes times
#: ~24 in objects, a fixed cost, and the common small request pays nothing.
WHOLE = 64 << 10
#: What JSON parsing may cost, in bytes of objects per byte of body.
COST_PER_BYTE = 3
#: What it may cost whatever the body's size (bytes of objects).
FREE_COST = 4 << 20
#: Bytes of text turned into numbers at once.
CHUNK = 256 << 10
#: The most bytes of objects one JSON container, string, or other value may
#: take (a dict with its pairs; a str; a float in its list slot).
CONTAINER_COST, STRING_COST, VALUE_COST = 160, 64, 40
#: The most bytes of objects a list kept as its text takes (its ``Numbers``,
#: its mark and the piece of text before it).
SPAN_COST = 320

_NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_NUMBERS = re.compile(rb"\[\s*" + _NUMBER + rb"(?:\s*,\s*" + _NUMBER + rb")*+\s*\]")
_BOOLS = re.compile(rb"\[\s*(?:true|false)(?:\s*,\s*(?:true|false))*+\s*\]")
# a string (as JSON pairs its quotes), and, when it is a key, the list after
# its colon up to the first ``]`` or quote (a mark ends with a space, so that
# nothing after the list can run on into its number)
_STRING = re.compile(rb'("(?:[^"\\]|\\.)*+")(?:\s*:\s*(\[[^\]"]*+\]))?', re.S)
_FLOAT = re.compile(rb"[.eE]")
#: An integer ``-0`` (as a float it is 0.0, not -0.0).
_NEGATIVE_ZERO = re.compile(rb"(?<![eE])-0(?![.eE0-9])")
#: A run of digits no int64 holds every value of.
LONG_INT = re.compile(rb"[0-9]{19}")
_DATA = b'"data"'
#: The number token a span stands as: no client knows the nonce.
_MARK = f"-0.0e-9{secrets.randbelow(10**18):018d}"
_WHITESPACE = b" \t\n\r"


class Numbers:
    """An input's ``data`` list as the body's text: ``[`` to ``]`` of numbers
    (``floats`` when any has a fraction or exponent) or of booleans.

    Example:
      >>> n = Numbers(b'{"data": [1, 2.5]}', 9, 17, False)
      >>> len(n), n.floats, n.booleans, list(n.chunks())
      (2, True, False, [b'1, 2.5'])
    """

    __slots__ = ("body", "booleans", "end", "floats", "n", "start")

    def __init__(self, body: bytes, start: int, end: int, booleans: bool) -> None:
        self.body, self.start, self.end, self.booleans = body, start, end, booleans
        self.n = body.count(b",", start, end) + 1
        self.floats = not booleans and _FLOAT.search(body, start, end) is not None

    def __len__(self) -> int:
        return self.n

    def chunks(self) -> Iterator[bytes]:
        """The text between the brackets, in pieces of about ``CHUNK`` bytes
        that each end before a comma (each piece is a list's inside)."""
        body, pos, end = self.body, self.start + 1, self.end - 1
        while pos < end:
            cut = body.find(b",", min(pos + CHUNK, end), end)
            stop = end if cut < 0 else cut
            yield body[pos:stop]
            pos = stop + 1

    def text(self) -> str:
        """The list as JSON text."""
        return self.body[self.start : self.end].decode("ascii")


def unsign_zeros(chunk: bytes) -> bytes:
    """``chunk`` with each integer ``-0`` written ``0`` (a float ``-0.0`` kept).

    Example:
      >>> unsign_zeros(b"-0, -0.0,-0")
      b' 0, -0.0, 0'
    """
    return _NEGATIVE_ZERO.sub(b" 0", chunk)


def booleans_of(chunk: bytes) -> Iterator[bool]:
    """The booleans of a piece of a boolean list, for ``numpy.fromiter``.

    Example:
      >>> list(booleans_of(b"true, false ,true"))
      [True, False, True]
    """
    for word in chunk.translate(None, _WHITESPACE).split(b","):
        yield word == b"true"


class TooCostly(Exception):
    """A body whose JSON would cost more than ``COST_PER_BYTE`` times its size."""

    def __init__(self, cost: int, limit: int) -> None:
        super().__init__(cost, limit)
        self.cost, self.limit = cost, limit


def split(body: bytes, whole: int = WHOLE) -> tuple[bytes, list[Numbers]]:
    """The body's text with each ``data`` list of numbers or booleans replaced
    by a mark, and those lists; the body and no lists for a body up to
    ``whole`` bytes.

    Raises:
      TooCostly: when what is left could cost more than the bound to parse.

    Example:
      >>> text, spans = split(b'{"data": [1, 2]}' + b" " * WHOLE)
      >>> len(spans), text.startswith(b'{"data": -0.0e-9')
      (1, True)
    """
    if len(body) <= whole:
        return body, []
    limit = max(FREE_COST, COST_PER_BYTE * len(body))
    # what no list taken out can lessen, first: a body of many objects or
    # strings is refused before it is scanned
    cost = CONTAINER_COST * body.count(b"{") + STRING_COST * (body.count(b'"') // 2)
    if cost > limit:
        raise TooCostly(cost, limit)
    spans: list[Numbers] = []
    for m in _STRING.finditer(body):
        start, end = m.span(2)
        if start < 0 or m.end(1) - m.start(1) != 6 or not body.startswith(_DATA, m.start()):
            continue
        booleans = _NUMBERS.fullmatch(body, start, end) is None
        if booleans and _BOOLS.fullmatch(body, start, end) is None:
            continue
        spans.append(Numbers(body, start, end, booleans))
        cost += SPAN_COST
        if cost > limit:  # many short lists: each costs what it is kept in
            raise TooCostly(cost, limit)
    # each list taken out leaves a mark: one value for its ``[`` and commas
    values = body.count(b",") + body.count(b":") + 1 - sum(len(n) - 1 for n in spans)
    cost += CONTAINER_COST * (body.count(b"[") - len(spans)) + VALUE_COST * values
    if cost > limit:
        raise TooCostly(cost, limit)
    if not spans:
        return body, []
    pieces, at = [], 0
    for k, n in enumerate(spans):
        pieces += [body[at : n.start], b"%s%010d " % (_MARK.encode(), k)]
        at = n.end
    pieces.append(body[at:])
    return b"".join(pieces), spans


def mark_index(text: str) -> int | None:
    """The span a number token stands for, or None for a client's number.

    Example:
      >>> mark_index(_MARK + "0000000003"), mark_index("-0.0e-9")
      (3, None)
    """
    if text.startswith(_MARK) and len(text) == len(_MARK) + 10:
        return int(text[len(_MARK) :])
    return None
