"""JSON that treeguard reads from files: parsed strictly and within bounds.

Python's ``json`` accepts duplicate keys (the last wins), ``NaN`` and
``Infinity``, integers of any length and nesting until the stack runs out.
A file an attacker wrote can use each of these to make two readers disagree
or to exhaust the interpreter, so every document treeguard reads goes
through :func:`loads`, which refuses them all with a ``FormatError``.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import FormatError

#: The deepest nesting of arrays and objects accepted.
MAX_DEPTH = 64
#: The most digits an integer may have (int64 needs 19).
MAX_INT_DIGITS = 20


class _Refused(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"the key {k[:40]!r} appears twice in one object")
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text)} digits is out of range")
    return int(text)


def _depth(raw: str) -> int:
    """The deepest nesting of ``[`` and ``{`` outside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
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
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def loads(raw: bytes | str, /, *, what: str, context: str | None = None) -> Any:
    """Parses a JSON document strictly.

    Args:
      raw: the document, UTF-8 if bytes.
      what: what it is, for the message (``"status file"``).
      context: where it came from (a path).

    Returns:
      The parsed value.

    Raises:
      FormatError: for text that is not UTF-8 or not JSON, a duplicate key,
        ``NaN``/``Infinity``, an integer of more than 20 digits, nesting
        deeper than 64, or a lone surrogate; the message says which.

    Example:
      >>> loads('{"a": 1}', what="pointer")
      {'a': 1}
      >>> loads('{"a": 1, "a": 2}', what="pointer")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: the pointer is not valid JSON: the key 'a' appears twice in one object
      hint: ...
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if _depth(text) > MAX_DEPTH:
            raise _Refused(f"it nests deeper than {MAX_DEPTH} levels")
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int)
        if "\\ud" in text.lower():
            text.encode("utf-8")  # raw escapes are checked below, on the parsed strings
            _no_surrogates(value)
        return value
    except (UnicodeError, ValueError, RecursionError) as e:
        raise FormatError(
            f"the {what} is not valid JSON: {e}",
            context=context,
            hint="treeguard writes this file itself; restore it from a backup or write it again",
        ) from None


def _no_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            v.encode("utf-8")  # raises UnicodeEncodeError for a lone surrogate
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
