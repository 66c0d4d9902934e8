"""Strict JSON reading for files treeguard wrote.

``json.loads`` accepts what no treeguard writer produces and what could make
a reader disagree with another: a key given twice (the last one wins),
``NaN`` and ``Infinity``, integers of any length (thousands of digits take
long to convert and then raise a bare ``ValueError``), nesting until the
stack runs out, and lone surrogates that no UTF-8 writer can write back.
``loads`` refuses each as a ``FormatError`` that says where; every JSON file
treeguard reads (headers, specs, store records, manifests) goes through it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import FormatError

#: No integer in a document has more digits than this (2**63 has 19).
MAX_INT_DIGITS = 20
#: The deepest nesting of arrays and objects accepted.
MAX_DEPTH = 512


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"the key {k[:80]!r} appears twice in one object")
        out[k] = v
    return out


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
    text: str | bytes, what: str, *, context: str | None = None, hint: str | None = None
) -> Any:
    """Parses JSON, refusing duplicate keys, NaN and Infinity, huge integers,
    nesting deeper than ``MAX_DEPTH`` and lone surrogates.

    Args:
      text: the document.
      what: what it is, for the message (``"the header"``).
      context: where it came from (a file), printed first.
      hint: the fix the message ends with.

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
    """
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        depth = _depth(text)
        if depth > MAX_DEPTH:
            raise FormatError(f"it nests deeper than {MAX_DEPTH} levels")
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
        )
        if "\\u" in text:
            _no_surrogates(value)
        return value
    except FormatError as e:
        raise FormatError(f"{what}: {e.message}", context=context, hint=hint) from None
    except (UnicodeError, ValueError, RecursionError) as e:
        message = f"{what} is not valid JSON: {e}"
        raise FormatError(message, context=context, hint=hint) from None


def _depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` outside strings (stops past the bound)."""
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
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


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


def dumps(value: Any, /) -> str:
    """The canonical text of a value: sorted keys, ASCII, no NaN.

    Example:
      >>> dumps({"b": 1, "a": [True, None]})
      '{"a":[true,null],"b":1}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
