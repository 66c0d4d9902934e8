"""ETags as object storage and the proxies in front of it answer them,
read in one place.

An ETag names one state of an object, in more than one form: quoted as
RFC 9110 writes it (``"9b2c..."``), without its quotes (some servers and
proxies), weak (``W/"9b2c..."``: nginx or a CDN that compresses an answer
weakens the ETag it passes on, since the bytes it sends are no longer
the object's) or a multipart upload's (``"9b2c...-3"``, no MD5 of the
bytes), and not always in the same form from one answer to the next.
Every ETag the store sends or compares goes through here:

- ``condition``: the form an ``If-Match`` carries, quoted and never
  weak. A server compares ``If-Match`` strongly, so a weak ETag sent
  back is refused (412) whatever the object holds; the tag a proxy
  weakened is the server's own, which pins the object as before. None
  for an answer that gave no ETag, or one of no value (``""``, ``W/""``:
  a proxy that blanks it): it pins nothing, and no request is sent
  without its condition in its place (a server takes ``If-Match:`` with
  no value as no condition at all: a compare-and-swap would replace
  whatever the object holds);
- ``same_object``: whether two ETags name one state of an object, whatever
  their form (RFC 9110's weak comparison): a tag read twice, or a 412
  told apart from a replaced object. Nothing about the bytes is taken
  from it.
- ``strong`` and ``md5_of``: an ETag taken as proof that an object
  holds given bytes, only when strong; a weak one proves nothing of the
  bytes (a proxy may give its own, as a CDN does, to other bytes), which
  are then read back and compared. Nor does a strong one on an answer's
  word alone: the one a PUT was answered with is sent back in
  ``If-Match``, for the server to vouch for it (a proxy may give strong
  ETags of its own too, alike on the PUT's answer and the HEAD's);
- ``Pin``: the ETag a reader pins its object with, and whether the server
  confirmed it.

Example (RFC 9110, section 8.8.3.2: a weak comparison):
  >>> pairs = [('W/"1"', 'W/"1"'), ('W/"1"', 'W/"2"'), ('W/"1"', '"1"'), ('"1"', '"1"')]
  >>> [(strong(a), same_object(a, b)) for a, b in pairs]
  [(None, True), (None, False), (None, True), ('"1"', True)]
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

#: An ETag's value of an MD5's form (a single PUT's, without SSE-KMS or SSE-C, is the MD5).
_MD5_RE = re.compile(r"^[0-9a-f]{32}$")


@dataclasses.dataclass
class Pin:
    """The one object a reader reads (``ObjectStorage.stream_range``): the
    ETag its first answer gave with its first bytes ``head``, and whether
    the server confirmed that ETag (``sure``: a GET carrying it as
    ``If-Match`` was answered); until then it is only that answer's word."""

    etag: str | None
    head: bytes
    sure: bool = False


def _value(etag: str | None) -> tuple[str, bool]:
    """The ETag's opaque value, without a weak prefix or quotes ('' for
    none, or one of no value), and whether it is weak: ``W/``, also as a
    proxy may write it, ``w/`` (a tag that says it is weak in any case
    proves no bytes)."""
    text = (etag or "").strip()
    weak = text[:2] in ("W/", "w/")
    return (text[2:] if weak else text).strip().strip('"'), weak


def condition(etag: str | None) -> str | None:
    """The ETag as an ``If-Match`` carries it: its value quoted, never weak;
    None for no ETag or one of no value, which pins nothing (the caller
    sends no request without the condition in its place).

    Example:
      >>> condition('W/"9b2c-3"'), condition("9b2c"), condition('"9b2c"'), condition("")
      ('"9b2c-3"', '"9b2c"', '"9b2c"', None)
      >>> condition('""'), condition('W/""'), condition(None)
      (None, None, None)
    """
    value = _value(etag)[0]
    return f'"{value}"' if value else None


def same_object(a: str | None, b: str | None) -> bool:
    """Whether ``a`` and ``b`` name one state of an object, whatever their
    form (weak or not, quoted or not); never for no ETag or one of no value.

    Example:
      >>> same_object('W/"9b2c"', "9b2c"), same_object('"9b2c"', '"9b2d"'), same_object('""', '""')
      (True, False, False)
    """
    value = _value(a)[0]
    return bool(value) and value == _value(b)[0]


def strong(etag: str | None) -> str | None:
    """The ETag as ``condition`` gives it when it is strong, the only kind
    that may prove bytes; None for a weak one (``W/``, ``w/``), none, or
    one of no value.

    Example:
      >>> strong('"9b2c"'), strong("9b2c"), strong('W/"9b2c"'), strong('w/"9b2c"'), strong('""')
      ('"9b2c"', '"9b2c"', None, None, None)
    """
    return None if _value(etag)[1] else condition(etag)


def md5_of(etag: str | None, data: bytes | memoryview) -> bool:
    """Whether ``etag`` is strong and the MD5 of ``data`` (S3's ETag of a
    single PUT); the MD5 is computed only for an ETag of its form.

    Example:
      >>> md5_of('"900150983cd24fb0d6963f7d28e17f72"', b"abc"), md5_of(
      ...     'W/"900150983cd24fb0d6963f7d28e17f72"', b"abc"
      ... )
      (True, False)
    """
    value, weak = _value(etag)
    return not weak and _MD5_RE.match(value) is not None and value == hashlib.md5(data).hexdigest()
