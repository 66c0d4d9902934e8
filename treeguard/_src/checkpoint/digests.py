"""A header's ``treeguard.hashes`` document read into one buffer of digests.

Parsed as JSON, the document is a dict of a name and a 64-character string
per tensor (about 250 bytes of objects for the 90 of its text), and every
name in it is one the tensor table already holds. ``scan`` reads the form
``save`` writes (the tensors in the table's order, ``json.dumps``'s blanks,
lowercase hex digests) into 32 bytes a tensor, each name compared in place
with the table's, and costs it before it is built.

``scan`` never refuses a document: anything else (another order or
spacing, a name the table does not hold there, a digest of another form)
returns None, and the caller parses it with ``strictjson.loads``, which
refuses exactly what it refused before.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from typing import overload

from ..hashing import HEX_LEN

#: A digest's bytes (``HEX_LEN`` hex digits).
DIGEST_BYTES = HEX_LEN // 2

_STR = r'"[^"\\\x00-\x1f]*+(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*+)*+"'
_PAIR = re.compile(rf'({_STR}): "([0-9a-f]{{{HEX_LEN}}})"(, |\}})')


class Digests(Sequence[str]):
    """Digests of ``DIGEST_BYTES`` each, in one buffer, read back as hex.

    Example:
      >>> Digests(bytearray(b"\\x01" * 64))[1] == "01" * 32
      True
    """

    def __init__(self, raw: bytearray) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw) // DIGEST_BYTES

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        start = range(0, len(self._raw), DIGEST_BYTES)[i]
        return self._raw[start : start + DIGEST_BYTES].hex()


def cost(count: int) -> int:
    """What ``scan`` builds for ``count`` tensors.

    Example:
      >>> cost(1000) - cost(0)
      32000
    """
    return sys.getsizeof(bytearray(1)) + DIGEST_BYTES * count


def scan(text: str, names: Iterable[str], count: int, budget: int) -> Digests | None:
    """The digests of ``text``, a hashes document naming the ``count``
    ``names`` in their order, read in at most ``budget`` bytes of objects;
    None for a document of another form or cost (the caller parses it as JSON).

    Example:
      >>> text = '{"[\\'w\\']": "' + "ab" * 32 + '"}'
      >>> scan(text, ["['w']"], 1, 10_000)[0] == "ab" * 32
      True
      >>> scan(text, ["['v']"], 1, 10_000) is None
      True
    """
    if cost(count) > budget or not text.startswith("{"):
        return None
    if count == 0:
        return Digests(bytearray()) if text == "{}" else None
    out, pos, end = bytearray(DIGEST_BYTES * count), 1, ""
    for i, name in enumerate(names):
        m = _PAIR.match(text, pos)
        if m is None or end == "}" or not _names(text, m.start(1), m.end(1), name, budget):
            return None
        out[DIGEST_BYTES * i : DIGEST_BYTES * (i + 1)] = bytes.fromhex(m.group(2))
        pos, end = m.end(), m.group(3)
    return Digests(out) if end == "}" and pos == len(text) else None


def _names(text: str, start: int, stop: int, name: str, budget: int) -> bool:
    """Whether the string token at ``start:stop`` of ``text`` is ``name``:
    compared in place, or, escaped, decoded (if it fits in ``budget``)."""
    if text.find("\\", start, stop) < 0:
        return stop - start - 2 == len(name) and text.startswith(name, start + 1)
    if 4 * (stop - start) + 80 > budget:  # what the decoded string may take
        return False
    try:
        return bool(json.loads(text[start:stop]) == name)
    except ValueError:
        return False
