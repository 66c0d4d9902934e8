"""What a failed request to object storage was, as the store's error.

obstore's exceptions say what went wrong in their text only: the server's
status, a missing bucket, the client's words for a timeout or for an answer
that is not the byte range asked for. They are read here, once: ``typed``
makes a ``StorageError`` naming the operation, the object and which failure
it was, ``permanent`` says whether a retry could mend it, and ``status``
gives the status the server answered. ``stream_size`` (a streamed answer
that is not the size it announced), ``head_contradicts`` (a 404 or a
size the object's HEAD does not confirm), ``etag_contradicts`` (a 412,
or a first answer's ETag, the object's HEAD does not confirm) and
``no_etag`` (an object whose answers give no ETag to pin it with) are
``Contradicted``: a failed
request, not evidence about the stored bytes, which ``ObjectStorage``
tries again as it does a 5xx; ``from_a_request`` says whether an error
was, however deep, such a failed request. ``unconfirmed`` (a write that
reading it back does not confirm) and ``unconditional`` (a replacement
with no ETag to make it conditional on) are the errors of writes.
A credential or a byte of an answer is never put in a message.
"""

from __future__ import annotations

import re

from ..errors import StorageError

_STATUS_RE = re.compile(r"status code: (\d{3})")
#: The client's words for a request that ran past its timeout (``AWS_TIMEOUT``,
#: 30 s by default, for the whole answer), and for an answer to a ranged GET
#: that is not the range asked for (a 200, another range, no Content-Range).
_TIMEOUT_RE = re.compile(r"timed out|kind: Timeout")
_RANGE_RE = re.compile(r"NotPartial|UnexpectedRange|ContentRange")
#: The server's code for a bucket that does not exist (in the body of its 404),
#: and the client's word for an http endpoint it may not use (no AWS_ALLOW_HTTP).
_NO_BUCKET = "NoSuchBucket"
_BAD_SCHEME = "BadScheme"
#: The hint of an answer that the object's HEAD contradicts.
_HEAD_SAYS_OTHERWISE = (
    "the server or a proxy in front of it answers otherwise than the object holds; "
    "nothing read was used: check it, then read again"
)
#: How a bucket is made, for the hint of a missing one.
_MAKE_BUCKET = {"s3": "`aws s3 mb s3://", "gs": "`gcloud storage buckets create gs://"}


def permanent(e: BaseException) -> bool:
    """Whether a failure is one no retry mends: a missing bucket, a refused scheme.

    Example:
      >>> permanent(OSError("NoSuchBucket: the bucket does not exist")), permanent(OSError("503"))
      (True, False)
    """
    text = str(e)
    return _NO_BUCKET in text or _BAD_SCHEME in text


def status(e: BaseException) -> str | None:
    """The HTTP status the server answered, as its three digits, or None
    (the text also holds a URL and a duration, never read as a status).

    Example:
      >>> status(OSError("... status code: 416, after 0.1s")), status(OSError("refused"))
      ('416', None)
    """
    found = _STATUS_RE.search(str(e))
    return None if found is None else found.group(1)


def typed(e: BaseException, doing: str, where: str, scheme: str, bucket: str) -> StorageError:
    """The ``StorageError`` of a failed request.

    Args:
      e: what the client raised.
      doing: the operation and the object, such as ``"reading STORE.json"``.
      where: the object's URL, the error's context.
      scheme: ``"s3"`` or ``"gs"``, for the hint of a missing bucket.
      bucket: the bucket's name.

    Returns:
      The error, saying which failure it was: a missing bucket, plain http
      not allowed, the status the server answered, a connection that failed
      or broke, a timeout, an answer that is not the range asked for, or
      else the exception's type.

    Example:
      >>> missing = OSError("NoSuchBucket")
      >>> print(typed(missing, "reading CURRENT.json", "s3://m/CURRENT.json", "s3", "m"))
      s3://m/CURRENT.json: reading CURRENT.json failed: the bucket m does not exist
      hint: create the bucket first (`aws s3 mb s3://m`); treeguard never creates one
    """
    text = str(e)
    code = status(e)
    hint = (
        "check that the server is reachable and the credentials in the environment "
        "allow it; the store was left as it was"
    )
    if _NO_BUCKET in text:
        why = f"the bucket {bucket} does not exist"
        make = f"{_MAKE_BUCKET[scheme]}{bucket}`"
        hint = f"create the bucket first ({make}); treeguard never creates one"
    elif _BAD_SCHEME in text:
        why = "the endpoint is plain http and AWS_ALLOW_HTTP is not set"
        hint = (
            "set AWS_ALLOW_HTTP=true to reach a server over plain http (such as one on "
            "127.0.0.1), or give AWS_ENDPOINT_URL an https:// address"
        )
    elif code is not None:
        why = f"the server answered {code}"
    elif "error sending request" in text or "onnection refused" in text:
        why = "the connection failed"
    elif _TIMEOUT_RE.search(text):
        why = "it timed out"
    elif _RANGE_RE.search(text):
        why = "the server did not answer with the byte range asked for"
    elif "body error" in text:
        why = "the connection broke during the answer"
    else:
        why = type(e).__name__
    return StorageError(f"{doing} failed: {why}", context=where, hint=hint)


def from_a_request(e: BaseException) -> bool:
    """Whether ``e`` is, or was caused (however deep in its ``__cause__``
    chain) by, a ``StorageError``: a request to storage that failed, which
    says nothing of the bytes stored.

    Example:
      >>> from_a_request(ValueError("hash mismatch")), from_a_request(StorageError("refused"))
      (False, True)
    """
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, StorageError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False


class Contradicted(StorageError):
    """An answer that contradicts itself or the object's HEAD (a body
    longer or shorter than it announced, a size or a 404 its HEAD does not
    confirm): a failed request, which says nothing of the stored bytes and
    which another try may mend (``ObjectStorage`` tries it again, then
    raises ``tried``)."""

    def tried(self, tries: int) -> StorageError:
        """The error once ``tries`` answers in a row lied: a plain
        ``StorageError`` (never tried again by the request's retries), its
        message saying so.

        Example:
          >>> lied = Contradicted("its answer was a 404", context="s3://m/a", hint="check it")
          >>> print(str(lied.tried(3)).splitlines()[0])
          s3://m/a: its answer was a 404 (on each of 3 tries)
        """
        return StorageError(
            f"{self.message} (on each of {tries} tries)", context=self.context, hint=self.hint
        )


def stream_size(
    name: str, where: str, size: int, came: int, *, more: bool, at: int | None = None
) -> Contradicted:
    """The error for object ``name`` (at ``where``) whose streamed bytes are
    not the ``size`` it was read for (the size its answer announced, or
    the range asked for from offset ``at``): ``came`` bytes, and ``more``
    when the stream ran past ``size`` (``came`` is then the bytes up to the
    part that went past it). The answer contradicts itself, so it says
    nothing of what is stored: a failed read, which is read again and never
    makes a verdict.

    Example:
      >>> print(str(stream_size("a", "s3://m/a", 1024, 1030, more=True)).splitlines()[0])
      s3://m/a: reading a failed: its stream ran past its 1,024 bytes: 1,030 or more came
      >>> cut = stream_size("a", "s3://m/a", 1024, 512, more=False, at=4096)
      >>> print(cut.message)
      reading a failed: its stream of the range at 4,096 ended after 512 of its 1,024 bytes
    """
    why = (
        f"ran past its {size:,} bytes: {came:,} or more came"
        if more
        else (f"ended after {came:,} of its {size:,} bytes")
    )
    stream = "its stream" if at is None else f"its stream of the range at {at:,}"
    return Contradicted(
        f"reading {name} failed: {stream} {why}",
        context=where,
        hint="the server or a proxy in front of it sent other bytes than the object's; nothing "
        "read was used: check it, then read again",
    )


def head_contradicts(name: str, where: str, answered: int | None, head: int) -> Contradicted:
    """The error for a GET of object ``name`` (at ``where``) that ``answered``
    a 404 (None) or a size that its HEAD, finding ``head`` bytes, does not
    confirm: a failed read, which is read again and never makes a verdict.

    Example:
      >>> print(str(head_contradicts("a", "s3://m/a", None, 1024)).splitlines()[0])
      s3://m/a: reading a failed: its answer was a 404, its HEAD 1,024 bytes
    """
    said = "a 404" if answered is None else f"{answered:,} bytes"
    return Contradicted(
        f"reading {name} failed: its answer was {said}, its HEAD {head:,} bytes",
        context=where,
        hint=_HEAD_SAYS_OTHERWISE,
    )


def etag_contradicts(name: str, where: str, *, first: bool) -> Contradicted:
    """The error for a GET of object ``name`` (at ``where``) carrying
    ``If-Match`` that the object's HEAD contradicts: a 412 while the HEAD
    has the ETag asked for, or (``first``) an ETag asked for that came from
    the first answer, which the HEAD does not give (the first bytes, read
    again under the HEAD's ETag, were the same: the first answer's ETag
    lied, not the object). A failed read, which is read again and never
    makes a verdict; no ETag is put in the message.

    Example:
      >>> print(str(etag_contradicts("a", "s3://m/a", first=False)).splitlines()[0])
      s3://m/a: reading a failed: its answer was a 412 for the ETag its HEAD gives
      >>> print(etag_contradicts("a", "s3://m/a", first=True).message)
      reading a failed: its first answer's ETag is not its HEAD's, with the same first bytes
    """
    said = (
        "its first answer's ETag is not its HEAD's, with the same first bytes"
        if first
        else "its answer was a 412 for the ETag its HEAD gives"
    )
    return Contradicted(
        f"reading {name} failed: {said}",
        context=where,
        hint=_HEAD_SAYS_OTHERWISE,
    )


def no_etag(name: str, where: str) -> Contradicted:
    """The error for object ``name`` (at ``where``) read in parts while
    neither its first answer nor its HEAD gave an ETag (none, or one of no
    value) that an ``If-Match`` could pin it with: its parts could be of
    two objects, so none is asked for. A failed read, which is read again
    and never makes a verdict.

    Example:
      >>> print(no_etag("a", "s3://m/a").message)
      reading a failed: neither its answer nor its HEAD gave an ETag to pin it with
    """
    return Contradicted(
        f"reading {name} failed: neither its answer nor its HEAD gave an ETag to pin it with",
        context=where,
        hint="a proxy in front of the server removes or blanks ETags; nothing read was used: "
        "reach the server without it, or have it pass ETags on, then read again",
    )


def unconditional(name: str, where: str) -> StorageError:
    """The error for replacing object ``name`` (at ``where``) read without
    an ETag (none, or one of no value: ``etags.condition``): a PUT with an
    ``If-Match`` of no value is one with no condition, which would replace
    whatever another writer wrote since the read. Nothing was written.

    Example:
      >>> print(unconditional("CURRENT.json", "s3://m/CURRENT.json").message.split(":")[0])
      replacing CURRENT.json failed
    """
    return StorageError(
        f"replacing {name} failed: it was read without an ETag (none, or an empty one), "
        "so it cannot be replaced only if unchanged; nothing was written",
        context=where,
        hint="a proxy in front of the server removes or blanks ETags: reach the server "
        "without it, or have it pass ETags on, then try again",
    )


def unconfirmed(name: str, where: str, answer: str | None, *, found: bool) -> StorageError:
    """The error for a write of object ``name`` (at ``where``) that reading
    it back does not confirm: the server's ``answer`` (None: it
    acknowledged it), and whether an object with other bytes was
    ``found`` (else none at all). Nothing was taken as written.

    Example:
      >>> print(unconfirmed("a", "s3://m/a", None, found=False).message)
      writing a failed: the server acknowledged it, but reading it back found no such object
    """
    what = "the object holds other bytes" if found else "no such object"
    return StorageError(
        f"writing {name} failed: the server {answer or 'acknowledged it'}, but reading it "
        f"back found {what}",
        context=where,
        hint="the server or a proxy in front of it does not do what it answers; nothing "
        "was taken as written: check it, then try again",
    )
