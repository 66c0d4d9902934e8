"""Key paths: the one place that turns a position in a pytree into text.

A path is a tuple of entries. Each entry is a pair ``(kind, key)``:

* ``("key", k)``: a mapping key, written ``['k']`` (JAX's ``DictKey``);
* ``("index", i)``: a sequence position, written ``[i]`` (``SequenceKey``);
* ``("attr", name)``: an attribute, written ``.name`` (``GetAttrKey``);
* ``("flat", i)``: a child of a custom node registered without keys, written
  ``[i]`` (``FlattenedIndexKey``).

The text form is JAX's ``keystr`` form, so a path printed by treeguard can be
pasted next to one printed by JAX. ``parse`` reads it back exactly, so the
text form can serve as a name (a checkpoint's tensor names are key paths).

Only the conversions to and from JAX's key objects import JAX, so reading
and printing paths (a spec file, a checkpoint header) works without it.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Literal, TypeAlias

from .strictjson import MAX_INT_DIGITS

EntryKind: TypeAlias = Literal["key", "index", "attr", "flat"]
Entry: TypeAlias = tuple[EntryKind, Any]
Path: TypeAlias = tuple[Entry, ...]


def entry_of(key: Any) -> Entry:
    """Converts one of JAX's key objects into a treeguard path entry.

    Args:
      key: a ``DictKey``, ``SequenceKey``, ``GetAttrKey`` or
        ``FlattenedIndexKey``.

    Returns:
      The ``(kind, key)`` pair.

    Raises:
      TypeError: for a key type JAX does not define.

    Example:
      >>> import jax
      >>> entry_of(jax.tree_util.DictKey("w"))
      ('key', 'w')
    """
    from jax import tree_util as _tu  # lazy: reading files never imports jax

    if isinstance(key, _tu.DictKey):
        return ("key", key.key)
    if isinstance(key, _tu.SequenceKey):
        return ("index", key.idx)
    if isinstance(key, _tu.GetAttrKey):
        return ("attr", key.name)
    if isinstance(key, _tu.FlattenedIndexKey):
        return ("flat", key.key)
    raise TypeError(f"unknown key path entry {key!r} of type {type(key).__name__}")


def int_digits(n: int) -> int:
    """The decimal digits of ``abs(n)``, counted without ``str(n)`` (which
    refuses an int of more than 4300 digits).

    Example:
      >>> int_digits(0), int_digits(-999), int_digits(10**5000)
      (1, 3, 5001)
    """
    n = abs(n)
    d = max(0, int((n.bit_length() - 1) * math.log10(2)))  # at most one short
    while 10 ** (d + 1) <= n:
        d += 1
    return d + 1


def entry_str(entry: Entry) -> str:
    """Formats one entry as JAX's ``keystr`` does; an int key too long to
    print names its length instead (``[<int of 5001 digits>]``).

    Example:
      >>> entry_str(("attr", "w")), entry_str(("key", "b")), entry_str(("index", 0))
      ('.w', "['b']", '[0]')
      >>> entry_str(("key", 10**5000))
      '[<int of 5001 digits>]'
    """
    kind, key = entry
    if type(key) is int and int_digits(key) > MAX_INT_DIGITS:
        return f"[<int of {int_digits(key)} digits>]"
    if kind == "key":
        return f"[{key!r}]"
    if kind == "attr":
        return f".{key}"
    return f"[{key}]"


def keystr(path: Path) -> str:
    """Formats a whole path, the root being the empty string.

    Args:
      path: a tuple of entries.

    Returns:
      The text form, identical to ``jax.tree_util.keystr`` of the same path.

    Example:
      >>> keystr((("key", "dense2"), ("key", "w")))
      "['dense2']['w']"
    """
    return "".join(entry_str(e) for e in path)


def parse(text: str) -> Path:
    """Reads a path back from its text form: the inverse of ``keystr``.

    Mapping keys are read as Python literals, so keys that hold dots,
    slashes, quotes or brackets survive the round trip. A bracketed integer
    is read as a sequence index.

    Args:
      text: a path such as ``"['dense1']['w']"`` or ``".layers[0].kernel"``.

    Returns:
      The tuple of entries.

    Raises:
      ValueError: if the text is not a path.

    Example:
      >>> parse("['a.b']['w']")
      (('key', 'a.b'), ('key', 'w'))
      >>> parse(".layers[0]")
      (('attr', 'layers'), ('index', 0))
    """
    entries: list[Entry] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ".":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            name = text[i + 1 : j]
            if not name.isidentifier():
                raise ValueError(f"bad attribute at offset {i} in path {text!r}")
            entries.append(("attr", name))
            i = j
        elif c == "[":
            j = _closing_bracket(text, i)
            inner = text[i + 1 : j]
            try:
                key = ast.literal_eval(inner)
            except (ValueError, SyntaxError) as e:
                raise ValueError(f"bad key {inner!r} at offset {i} in path {text!r}") from e
            if inner.lstrip("-").isdigit():
                entries.append(("index", int(inner)))
            else:
                entries.append(("key", key))
            i = j + 1
        else:
            raise ValueError(f"unexpected {c!r} at offset {i} in path {text!r}")
    return tuple(entries)


def _closing_bracket(text: str, start: int) -> int:
    """Finds the ``]`` that closes the ``[`` at ``start``, skipping quoted text."""
    quote: str | None = None
    i = start + 1
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "]":
            return i
        i += 1
    raise ValueError(f"unclosed '[' at offset {start} in path {text!r}")


def jax_path(path: Path) -> tuple[Any, ...]:
    """Converts entries back into JAX's key objects.

    Example:
      >>> jax_path((("key", "w"),))
      (DictKey(key='w'),)
    """
    from jax import tree_util as _tu  # lazy: reading files never imports jax

    out: list[Any] = []
    for kind, key in path:
        if kind == "key":
            out.append(_tu.DictKey(key))
        elif kind == "index":
            out.append(_tu.SequenceKey(key))
        elif kind == "attr":
            out.append(_tu.GetAttrKey(key))
        else:
            out.append(_tu.FlattenedIndexKey(key))
    return tuple(out)


#: The exact key types a dict key may have in a saved tree (no subclasses:
#: an enum or a numpy scalar prints as something that does not read back).
_KEY_TYPES = (str, int, float, bool, type(None))


def entry_problem(entry: Entry) -> str | None:
    """Why one entry would not read back from its text form, or None.

    An entry reads back when ``parse(entry_str(entry))`` gives the same key
    of the same type (a ``flat`` entry and an int dict key read back as an
    index, which prints alike). Enums, numpy scalars and other objects do
    not; nor do strings with lone surrogates, which have no UTF-8 form.

    Example:
      >>> import numpy as np
      >>> entry_problem(("key", "w")) is None, entry_problem(("key", np.int64(1)))
      (True, 'key np.int64(1) of type int64 does not read back')
    """
    kind, key = entry
    if kind == "key" and type(key) not in _KEY_TYPES:
        return f"key {short_repr(key)} of type {type(key).__name__} does not read back"
    if kind in ("index", "flat") and type(key) is not int:
        return f"index {short_repr(key)} of type {type(key).__name__} is not an int"
    if kind == "attr" and type(key) is not str:
        return f"attribute {short_repr(key)} of type {type(key).__name__} is not a str"
    if isinstance(key, str) and has_surrogate(key):
        what = "key" if kind == "key" else "attribute"
        return f"{what} {key!r} holds a lone surrogate, which has no UTF-8 form"
    if isinstance(key, float) and not math.isfinite(key):
        return f"key {key!r} of type float has no JSON form"
    if type(key) is int and int_digits(key) > MAX_INT_DIGITS:
        return f"{kind} of {int_digits(key)} digits is too long to read back from a spec"
    text = entry_str(entry)
    shown = f"{kind} {short_repr(key)} of type {type(key).__name__} prints as {text[:60]!r}"
    try:
        back = parse(text)
    except ValueError:
        return f"{shown}, which does not parse back"
    want_kind = "index" if kind == "flat" or (kind == "key" and type(key) is int) else kind
    if len(back) != 1 or back[0] != (want_kind, key) or type(back[0][1]) is not type(key):
        return f"{shown}, which reads back as another key"
    return None


def short_repr(x: Any, limit: int = 60) -> str:
    """``repr(x)`` cut to ``limit`` characters, for naming a key in a message.

    Example:
      >>> short_repr("w"), short_repr(10**5000)
      ("'w'", '<int of 5001 digits>')
    """
    if type(x) is int and int_digits(x) > MAX_INT_DIGITS:
        return f"<int of {int_digits(x)} digits>"
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a repr that fails still gets a message
        text = f"<{type(x).__qualname__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate, so it has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def starts_with(path: Path, prefix: Path) -> bool:
    """Whether ``path`` lies at or below ``prefix``."""
    return path[: len(prefix)] == prefix


def parse_user_path(text: Any, what: str) -> Path:
    """A key path a caller gave for option ``what``, parsed.

    Raises:
      ValueError: for text that is no key path, naming the option.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} paths are key-path strings, got {type(text).__name__}")
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"{what}: {e}; write paths as \"['dense1']['w']\"") from None
