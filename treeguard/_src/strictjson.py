"""Strict JSON reading for files treeguard wrote.

``json.loads`` accepts what no treeguard writer produces and what could make
a reader disagree with another: a key given twice (the last one wins),
``NaN`` and ``Infinity``, integers of any length (thousands of digits take
long to convert and then raise a bare ``ValueError``), nesting until the
stack runs out, and lone surrogates that no UTF-8 writer can write back.
``loads`` refuses each as a ``FormatError`` that says where; every JSON file
treeguard reads (headers, specs, store records, manifests) goes through it.

Parsed, JSON costs more than its text: an empty list is 64 bytes of objects
for the 3 of ``[],``, so 30 MB of text can take 700 MB. ``Shape`` measures a
document first, at the speed of ``re`` and ``str.count`` and without a
Python object per value: what JSON parsing would build (``Shape.cost``) and
how deep it nests. A reader that knows what its document may cost passes
``loads`` a ``budget`` and a document over it is refused before it is built.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import FormatError

#: No integer in a document has more digits than this (2**63 has 19).
MAX_INT_DIGITS = 20
#: The deepest nesting of arrays and objects accepted.
MAX_DEPTH = 512


#: A string as JSON pairs its quotes (one left open runs to the end).
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.S)
_TERMINATED = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
#: Strings measured at once, and a run of that many (what precedes each
#: included), ending at a closing quote.
_STRINGS_AT_ONCE = 4096
_RUN = re.compile(rf'(?:[^"]*+{_TERMINATED}){{1,{_STRINGS_AT_ONCE}}}', re.S)
#: Outside strings: all but the brackets dropped (JSON's other characters).
_BRACKETS = str.maketrans(dict.fromkeys("0123456789-+.eEtrufalsn,: \t\n\r"))
#: Outside strings: every character that starts a number made ``0``, blanks dropped,
#: so that ``[0``, ``,0`` and ``:0`` count the numbers.
_NUMBERS = str.maketrans({**dict.fromkeys("123456789-", "0"), **dict.fromkeys(" \t\n\r")})
#: Bytes of objects per value JSON parsing builds (CPython 3.11, 64-bit),
#: each an upper bound: a ``str`` past its characters (ASCII, and not), a list
#: of up to 4, a dict when empty and per pair, a number, and the slot that
#: holds any value. ``tests/test_files.py`` checks them against ``tracemalloc``.
ASCII_STR_COST, STR_COST, LIST_COST, DICT_COST, PAIR_COST = 56, 80, 88, 64, 40
NUMBER_COST, SLOT_COST = 40, 8


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a JSON text holds, counted without parsing it.

    Attributes:
      chars: the text's length.
      ascii: whether it is all ASCII.
      width: bytes per character of a ``str`` holding the text (1, 2 or 4).
      strings: how many strings (keys and values).
      string_chars: their characters, quotes included.
      lists, dicts, pairs, numbers, commas: the other tokens outside strings.
      shared: the bytes of the repeats of ``shared_keys``, which parsing
        does not build (``json.loads`` keeps one string per key text).
      brackets: the brackets outside strings, in order (what ``depth`` reads).

    Example:
      >>> s = Shape.of('{"a": [1, 2, []]}')
      >>> s.strings, s.lists, s.dicts, s.numbers, s.depth()
      (1, 2, 1, 2, 3)
    """

    chars: int
    ascii: bool
    width: int
    strings: int
    string_chars: int
    lists: int
    dicts: int
    pairs: int
    numbers: int
    commas: int
    shared: int = 0
    brackets: str = dataclasses.field(default="", repr=False)

    @classmethod
    def of(cls, text: str, shared_keys: Sequence[str] = ()) -> Shape:
        """Measures ``text``: ``_STRINGS_AT_ONCE`` strings at a time, each
        run of them cut at a closing quote (``re`` finds it), their text
        removed (``re.sub`` keeps a piece per string, so the run bounds
        those) and what is left counted (``str.count``)."""
        counts = dict.fromkeys(("strings", "string_chars", "lists", "dicts"), 0)
        counts |= dict.fromkeys(("pairs", "numbers", "commas"), 0)
        brackets: list[str] = []
        pos = 0
        while pos < len(text) or not brackets:
            run = _RUN.match(text, pos)
            end = run.end() if run else len(text)
            piece = text if (pos, end) == (0, len(text)) else text[pos:end]
            rest, strings = _STRING.subn("", piece)
            counts["strings"] += strings
            counts["string_chars"] += len(piece) - len(rest)
            del piece
            digits = rest.translate(_NUMBERS)
            counts["numbers"] += sum(map(digits.count, ("[0", ",0", ":0"))) + (digits[:1] == "0")
            del digits
            for key, ch in (("lists", "["), ("dicts", "{"), ("pairs", ":"), ("commas", ",")):
                counts[key] += rest.count(ch)
            brackets.append(rest.translate(_BRACKETS))
            pos = end
        return cls(
            chars=len(text),
            ascii=text.isascii(),
            width=_width(text),
            shared=sum(_repeats(text, key) * (ASCII_STR_COST + len(key)) for key in shared_keys),
            brackets="".join(brackets),
            **counts,
        )

    def depth(self) -> int:
        """The deepest nesting of ``[`` and ``{`` (stops past ``MAX_DEPTH``);
        a loop over the brackets alone, so measure the cost first."""
        depth = deepest = 0
        for ch in self.brackets:
            if ch in "[{":
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if deepest > MAX_DEPTH:
                        return deepest
            elif ch in "]}":
                depth -= 1
        return deepest

    @property
    def cost(self) -> int:
        """An upper bound on the bytes of the objects ``json.loads`` builds."""
        return (
            self.strings * (ASCII_STR_COST if self.ascii else STR_COST)
            + self.string_chars * self.width
            + self.lists * LIST_COST
            + self.dicts * DICT_COST
            + self.pairs * PAIR_COST
            + self.numbers * NUMBER_COST
            + (self.commas + self.lists + self.dicts + 1) * SLOT_COST
            - self.shared
        )


def _repeats(text: str, key: str) -> int:
    """How many times ``key`` is a key in ``text`` past its first (a ``"``
    after a backslash ends no string, so ``\\"key":`` is not one)."""
    found = text.count(f'"{key}":') - text.count(f'\\"{key}":')
    return max(0, found - 1)


def _width(text: str) -> int:
    """Bytes per character of ``text`` (a ``str`` is as wide as its widest
    character, and so is every piece of it at most)."""
    if text.isascii():
        return 1
    if len(text) < 4096:
        return 4
    per_char = sys.getsizeof(text) / len(text)
    return 1 if per_char < 1.5 else 2 if per_char < 3 else 4


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"the key {k[:80]!r} appears twice in one object")
        out[k] = v
    return out


#: The most distinct objects ``loads(..., share=...)`` keeps to share.
MAX_SHARED = 4096


class _Sharing:
    """An ``object_pairs_hook`` that returns, for an object ``share`` picks
    whose values are scalars or lists of scalars, the first equal one it
    built (at most ``MAX_SHARED`` kept). Equal means of equal types too, so
    ``1``, ``1.0`` and ``true`` never stand for one another."""

    def __init__(self, share: Callable[[dict[str, Any]], bool]) -> None:
        self.share = share
        self.seen: dict[tuple[Any, ...], dict[str, Any]] = {}

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = _no_duplicates(pairs)
        if not self.share(out):
            return out
        try:
            key = tuple((k, _typed(v)) for k, v in pairs)
            found = self.seen.get(key)
        except TypeError:  # a value that is not a scalar or a list of them
            return out
        if found is not None:
            return found
        if len(self.seen) < MAX_SHARED:
            self.seen[key] = out
        return out


def _typed(value: Any) -> tuple[Any, ...]:
    """``value`` with its type, as a key; a list as a tuple of its items'.
    ``TypeError`` for a float (``0.0 == -0.0``), a nested list or an object."""
    if type(value) is list:
        return tuple(_typed(x) for x in value if type(x) is not list or _unshared())
    if type(value) is float:
        _unshared()
    return (type(value), value)


def _unshared() -> bool:
    raise TypeError("not shared")


def _no_constant(name: str) -> Any:
    raise FormatError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise FormatError(f"an integer of {len(text)} digits is larger than any size or offset")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise FormatError(f"the number {text[:40]} is too large for a float")
    return value


def loads(
    text: str | bytes,
    what: str,
    *,
    context: str | None = None,
    hint: str | None = None,
    budget: int | None = None,
    over_hint: str | None = None,
    shared_keys: Sequence[str] = (),
    share: Callable[[dict[str, Any]], bool] | None = None,
) -> Any:
    """Parses JSON, refusing duplicate keys, NaN and Infinity, huge integers,
    nesting deeper than ``MAX_DEPTH``, lone surrogates and, given a budget,
    a document whose objects would cost more than it.

    Args:
      text: the document.
      what: what it is, for the message (``"the header"``).
      context: where it came from (a file), printed first.
      hint: the fix the message ends with.
      budget: the most bytes the parsed objects may take (``Shape.cost``);
        None for no bound.
      over_hint: the fix for a document over ``budget`` (``hint`` if None).
      shared_keys: keys expected many times (a table's column names), whose
        repeats ``Shape.cost`` does not count.
      share: picks objects of scalars (and lists of them) that may be one
        object wherever they are equal, as a spec's leaves repeat; the caller
        must not change them. None to share none.

    Raises:
      FormatError: naming ``what`` and the fault.

    Example:
      >>> loads('{"a": 1, "a": 2}', "the header")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: the header: the key 'a' appears twice in one object
      >>> loads("[NaN]", "the spec")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: the spec: NaN is not a JSON number
      >>> loads("[" + "[]," * 1000 + "[]]", "the header", budget=10_000)
      Traceback (most recent call last):
      ...
      treeguard.FormatError: the header: its 3,004 bytes of JSON would take about 104,200 \
bytes of objects, over the 10,000 its reader allows
    """
    fix = hint
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        shape = Shape.of(text, shared_keys)
        if budget is not None and shape.cost > budget:
            fix = over_hint or hint
            raise FormatError(
                f"its {len(text):,} bytes of JSON would take about {shape.cost:,} bytes of "
                f"objects, over the {budget:,} its reader allows"
            )
        if shape.depth() > MAX_DEPTH:
            raise FormatError(f"it nests deeper than {MAX_DEPTH} levels")
        del shape
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates if share is None else _Sharing(share),
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
        )
        if "\\u" in text:
            _no_surrogates(value)
        return value
    except FormatError as e:
        raise FormatError(f"{what}: {e.message}", context=context, hint=fix) from None
    except (UnicodeError, ValueError, RecursionError) as e:
        message = f"{what} is not valid JSON: {e}"
        raise FormatError(message, context=context, hint=hint) from None


def _no_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            v.encode("utf-8")  # UnicodeEncodeError for a lone surrogate
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def json_ready(value: Any, /, *, nonfinite: Callable[[float], Any] = lambda _: None) -> Any:
    """``value`` in the types ``json.dumps`` writes without NaN: keys as
    text, tuples as lists, numpy scalars (anything 0-d with ``.item()``) as
    Python ones, paths as text, and a non-finite float as ``nonfinite(x)``
    (None by default).

    Example:
      >>> import numpy as np
      >>> json_ready({1: (np.float32(0.5), float("nan"))})
      {'1': [0.5, None]}
      >>> json_ready([float("-inf")], nonfinite=str)
      ['-inf']
    """
    if isinstance(value, dict):
        return {str(k): json_ready(v, nonfinite=nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v, nonfinite=nonfinite) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return nonfinite(value)
    if callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ():
        return json_ready(value.item(), nonfinite=nonfinite)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def dumps(value: Any, /) -> str:
    """The canonical text of a value: sorted keys, ASCII, no NaN.

    Example:
      >>> dumps({"b": 1, "a": [True, None]})
      '{"a":[true,null],"b":1}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
