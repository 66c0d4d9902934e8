"""The storage protocol on object storage (S3 and GCS), through ``obstore``.

``s3://bucket/prefix`` and ``gs://bucket/prefix`` name a store's objects
under a prefix. Every write is conditional, so no lock server is needed:

- ``create`` is a PUT with ``If-None-Match: *`` (a 412 is
  ``Conflict.EXISTS``);
- ``swap`` is a PUT with ``If-Match: <etag>`` (on GCS, the generation), or
  a create when the object was absent (a 412 is ``Conflict.CHANGED``).

An ETag is sent and compared in one form whatever form an answer gave it
in (weak through a compressing proxy, unquoted), and taken as proof of the
bytes only when strong (etags.py).

Credentials, region and endpoint come from the standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``GOOGLE_*`` for GCS), read by the
client; they are never put in a message, nor is any byte of an answer. A
failure of the network or the server (refused, timed out, 5xx, an answer
that is not the byte range asked for) is a ``StorageError`` naming the
operation, the object and which of these it was. Every request, its answer
included, ends within the client's timeout (``AWS_TIMEOUT``, 30 s by
default), so a server that stalls never hangs a reader. Only idempotent operations (reads, lists,
deletes) are retried; a conditional write is tried once, since a retry
after a lost answer would report the writer's own success as a conflict.

No write is taken on the server's word: ``create`` and ``swap`` read the
object back and report what it holds (a 200 for a write not performed is a
``StorageError``; a 412 for a write performed is a success).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import FormatError, StorageError, StoreError
from ..hashing import prefault
from . import etags, objecterrors
from .download import hand_over
from .etags import Pin
from .storage import Conflict, check_object_name

#: Where ``now`` writes the object whose time it reads.
CLOCK = "clock"
#: The URL schemes this backend serves.
SCHEMES = ("s3", "gs")
#: How many times an idempotent request is tried, and the first pause between tries.
_TRIES = 3
_PAUSE = 0.2
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,220}$")
_URL_RE = re.compile(r"^(s3|gs):/")
#: The least bytes a streamed read hands over at a time.
_STREAM_CHUNK = 4 << 20
#: The least bytes ``stream`` hands over at a time: the client's own parts
#: (a few hundred KiB on a fast link) pass as they come, with no copy to join
#: them, each hashed while in the cache.
_PART = 64 << 10
#: The first bytes of an object fetched (and kept) on its first read: a
#: checkpoint's header, parsed more than once, in one request.
_HEAD_BYTES = 64 << 10
_T = TypeVar("_T")

if TYPE_CHECKING:
    from obstore.store import RetryConfig


def is_url(root: object) -> bool:
    """Whether ``root`` names a store in a bucket (``s3://`` or ``gs://``),
    also as a ``pathlib.Path`` made of one, which collapses ``//`` to ``/``."""
    if not isinstance(root, (str, os.PathLike)):
        return False
    return _URL_RE.match(str(os.fspath(root))) is not None


def normal_url(root: str | os.PathLike[str]) -> str:
    """A store URL with the ``//`` a ``pathlib.Path`` collapsed put back."""
    return re.sub(r"^(s3|gs):/+", r"\1://", str(os.fspath(root)))


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket, prefix)`` of a store URL.

    Raises:
      StoreError: for a URL without a valid bucket name, or with a prefix
        holding empty, ``.`` or ``..`` parts.
    """
    scheme, rest = url.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not _BUCKET_RE.match(bucket) or (
        prefix and any(p in ("", ".", "..") for p in prefix.split("/"))
    ):
        raise StoreError(
            "not a store URL: it needs a bucket name and an optional prefix of plain parts",
            context=url,
            hint=f"write {scheme}://BUCKET/PREFIX, such as {scheme}://models/mlp",
        )
    return scheme, bucket, prefix


class ObjectStorage:
    """A store's objects under ``s3://bucket/prefix`` or ``gs://bucket/prefix``.

    Args:
      url: the store's URL.

    Raises:
      StoreError: for a URL that is not one, or a client that cannot be
        configured from the environment.
    """

    def __init__(self, url: str) -> None:
        from obstore.store import GCSStore, S3Store  # lazy: the optional [s3] extra

        scheme, bucket, prefix = split_url(url)
        self.bucket, self._scheme = bucket, scheme
        self.url = f"{scheme}://{bucket}" + (f"/{prefix}" if prefix else "")
        self._s3 = scheme == "s3"
        once: RetryConfig = {"max_retries": 0}  # retries are ours, of idempotent requests only
        try:
            if self._s3:
                self._store: Any = S3Store(
                    bucket,
                    prefix=prefix or None,
                    config={"conditional_put": "etag"},
                    retry_config=once,
                )
            else:
                self._store = GCSStore(bucket, prefix=prefix or None, retry_config=once)
        except Exception as e:  # noqa: BLE001 - the client's configuration errors are untyped
            raise StoreError(
                f"cannot configure the {scheme} client: {type(e).__name__}",
                context=self.url,
                hint="check AWS_REGION, AWS_ENDPOINT_URL and the credentials in the environment",
            ) from None

    def where(self, name: str) -> str:
        return f"{self.url}/{check_object_name(name)}"

    def _failed(self, operation: str, name: str, e: BaseException) -> StorageError:
        return objecterrors.typed(
            e, f"{operation} {name}", f"{self.url}/{name.lstrip('/')}", self._scheme, self.bucket
        )

    def _idempotent(
        self, operation: str, name: str, call: Callable[[], _T], progress: Callable[[], int] = int
    ) -> _T:
        """``call()``, tried again after a pause when it failed in a way that
        another try may mend: the network or a 5xx, or an answer that lied
        (``objecterrors.Contradicted``); ``_TRIES`` such failures end it.
        A try that brought bytes (``progress``, the bytes handed over so far,
        grew) before the network or the server broke it starts the count
        again, as a download resumed where it stopped; an answer that lied
        counts whatever it brought."""
        from obstore.exceptions import BaseError, GenericError  # lazy: the optional [s3] extra

        pause, failed = _PAUSE, 0
        while True:
            before = progress()
            try:
                return call()
            except objecterrors.Contradicted as e:  # an answer that lied: the next may not
                failed += 1
                if failed == _TRIES:
                    raise e.tried(_TRIES) from None
            except GenericError as e:  # the network or a 5xx: worth another try
                pause, failed = (_PAUSE, 1) if progress() != before else (pause, failed + 1)
                if failed == _TRIES or objecterrors.permanent(e):
                    raise self._failed(operation, name, e) from None
            except (BaseError, OSError) as e:  # refused by the server: no retry helps
                raise self._failed(operation, name, e) from None
            time.sleep(pause)
            pause *= 2

    @staticmethod
    def _tag(meta: Any) -> str:
        """The object's tag: its ETag as ``If-Match`` carries it (so tags read
        in other forms compare equal) and its version, if any."""
        return f"{etags.condition(meta.get('e_tag')) or ''}|{meta.get('version') or ''}"

    def _put(
        self, name: str, data: bytes | memoryview, mode: Any, lost: Conflict
    ) -> str | Conflict | None:
        """The ETag the PUT was answered with, as it came; ``lost`` after a 412."""
        import obstore  # lazy: the optional [s3] extra
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            got = obstore.put(self._store, name, data, mode=mode, use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            return lost
        except FileNotFoundError as e:
            if mode == "create" or objecterrors.permanent(e):
                raise self._failed("writing", name, e) from None
            return lost  # replacing an object that is gone
        except (obstore.exceptions.BaseError, OSError) as e:
            raise self._failed("writing", name, e) from None
        return got.get("e_tag")

    def create(self, name: str, data: bytes | memoryview) -> str | Conflict:
        """Writes ``name`` only if absent, and confirms it by reading back.

        Returns the object's tag once it holds exactly ``data``, whatever
        the server answered (a 412 for a write it performed is a success);
        ``Conflict.EXISTS`` when it holds other bytes after a 412. A write
        the server acknowledged but that left no object, or other bytes,
        is a ``StorageError``. The bytes, not the writer, are confirmed:
        where ownership matters, callers write bytes no other writer
        makes (a record's random uid) or arbitrate on such an object.
        """
        check_object_name(name)
        got = self._put(name, data, "create", Conflict.EXISTS)
        held = self._holding(name, data, None if isinstance(got, Conflict) else got)
        if held is not None and held[1]:
            return held[0]
        if isinstance(got, Conflict) and held is not None:
            return got
        answer = "refused it" if isinstance(got, Conflict) else None
        raise objecterrors.unconfirmed(name, self.where(name), answer, found=held is not None)

    def swap(self, name: str, data: bytes, expected: str | None) -> str | Conflict:
        """Replaces ``name`` only if its tag is ``expected`` (absent when
        None), and confirms it by reading back: its new tag once it holds
        ``data`` (also after a 412 for a write performed);
        ``Conflict.CHANGED`` after a 412, or when another writer replaced it
        since (whether this write landed first cannot be told from the
        bytes: the pointer's ids tell, see pointer.py). A write acknowledged
        while the object is still the one it was to replace, or gone, is a
        ``StorageError``, as is an ``expected`` without its ETag (``unconditional``)."""
        check_object_name(name)
        if expected is None:
            got = self._put(name, data, "create", Conflict.CHANGED)
        else:
            e_tag, _, version = expected.partition("|")
            if not (e_tag if self._s3 else version):
                raise objecterrors.unconditional(name, self.where(name))
            mode = {"e_tag": e_tag} | ({"version": version} if version else {})
            got = self._put(name, data, mode, Conflict.CHANGED)
        found = self._read_back(name, max(len(data), _HEAD_BYTES))
        if found is not None and found[0] == data:
            return found[1]
        if isinstance(got, Conflict):
            return got
        if found is None or found[1] == expected:
            raise objecterrors.unconfirmed(name, self.where(name), None, found=found is not None)
        return Conflict.CHANGED

    def _holding(
        self, name: str, data: bytes | memoryview, answered: str | None
    ) -> tuple[str, bool] | None:
        """The object's tag now and whether it holds exactly ``data``; None if
        absent. A small object is read whole; a large one confirmed by the
        PUT's strong ETag as the server vouches for it (``_vouched``), else
        its size and its HEAD's strong ETag, the MD5 of ``data`` (S3's for a
        single PUT), else its bytes read back (``_reads_as``: GCS's and
        SSE-KMS's ETags are no MD5). The MD5 (4x the BLAKE3 digest's cost)
        and a read back are paid only after a 412 or a wrong or weak ETag:
        bytes changed on their way to the server are left to every load's digests."""
        if len(data) <= _HEAD_BYTES:
            found = self._read_back(name, _HEAD_BYTES)
            return None if found is None else (found[1], found[0] == data)
        vouched = self._vouched(name, data, answered)
        if vouched is not None:
            return vouched, True
        meta = self._head(name)
        if meta is None:
            return None
        same = int(meta["size"]) == len(data) and (
            etags.md5_of(meta.get("e_tag"), data) or self._reads_as(name, data)
        )
        return self._tag(meta), same

    def _vouched(self, name: str, data: bytes | memoryview, answered: str | None) -> str | None:
        """The object's tag if, under ``If-Match`` with the PUT's strong ETag, it
        has ``data``'s size and first bytes (``_begins``): no proxy's word."""
        etag = etags.strong(answered)
        if etag is None:
            return None
        head = np.frombuffer(data, np.uint8)[:_HEAD_BYTES].tobytes()
        meta = self._idempotent("reading", name, lambda: self._begins(name, etag, head))
        return self._tag(meta) if meta is not None and int(meta["size"]) == len(data) else None

    def _reads_as(self, name: str, data: bytes | memoryview) -> bool:
        """Whether ``name`` holds exactly ``data``, streamed back part by part
        (never held whole); not one of another size (``stream``'s answer)."""
        want = np.frombuffer(data, np.uint8)
        same = [True]

        def each(pos: int, part: memoryview) -> None:
            if pos == 0:
                same[0] = True  # a retry starts again
            got = np.frombuffer(part, np.uint8)
            same[0] = same[0] and np.array_equal(want[pos : pos + len(got)], got)

        return self.stream(name, len(want), each) == len(want) and same[0]

    def _read_back(self, name: str, limit: int) -> tuple[bytes, str] | None:
        """An object just written, read back; a 404 its HEAD contradicts is
        read again (``confirm_missing``), never a write taken as not made."""
        return self.read(name, limit=limit, what="object written", confirm_missing=True)

    def read(
        self, name: str, *, limit: int, what: str, confirm_missing: bool = False
    ) -> tuple[bytes, str] | None:
        """The bytes and tag of ``name``, at most ``limit`` of them (``what``
        it is, for the error); None if absent. With ``confirm_missing`` (an
        object whose absence would say something of a version), a 404 is
        taken only once the object's HEAD agrees (``_confirmed``): one its
        HEAD contradicts is an answer that lied, read again."""

        def get() -> tuple[bytes, str] | None:
            result = self._get(name)
            if result is None:
                if confirm_missing:
                    self._confirmed(name, 0, None)  # Contradicted if its HEAD finds it
                return None
            if result.meta["size"] > limit:
                raise StoreError(
                    f"the {what} is {result.meta['size']} bytes, more than the {limit} allowed",
                    context=self.where(name),
                    hint="the store writes this object itself; restore it from a backup",
                )
            return bytes(result.bytes()), self._tag(result.meta)

        return self._idempotent("reading", check_object_name(name), get)

    def stream(self, name: str, size: int, each: Callable[[int, memoryview], None]) -> int | None:
        """Streams ``name`` in one GET when it holds ``size`` bytes,
        ``each(offset, part)`` called on each part as it arrives (the
        client's memory, valid during the call; a retry starts at 0 again),
        never past ``size`` bytes. Its size (as read), or None if absent. An
        answer that lies is read again, as a 5xx is: a stream that runs past
        ``size`` or ends short of it (``download.hand_over``), a 404 or
        another size its HEAD does not confirm (``_confirmed``)."""

        def get() -> int | None:
            result = self._get(name)
            if result is None or result.meta["size"] != size:
                held = None if result is None else int(result.meta["size"])
                return self._confirmed(name, size, held)
            parts = result.stream(min_chunk_size=_PART)
            return hand_over(parts, size, each, name=name, where=self.where(name))

        return self._idempotent("reading", check_object_name(name), get)

    def _confirmed(self, name: str, size: int, answered: int | None) -> int | None:
        """``answered`` (a GET's 404 as None, or a size other than ``size``)
        once the object's HEAD agrees; else ``objecterrors.Contradicted``."""
        found = self.size(name)
        if found is None or (answered is not None and found != size):
            return answered
        raise objecterrors.head_contradicts(name, self.where(name), answered, found)

    def read_into(
        self, name: str, buf: memoryview, each: Callable[[int, memoryview], None]
    ) -> int | None:
        """Streams ``name`` into ``buf`` in one GET when it holds ``len(buf)``
        bytes, ``each(offset, part)`` called on each part once written (a
        retry starts at 0 again). Its size (as read), or None if absent.
        The pages of each part are faulted in as it arrives, in one call
        (``hashing.prefault``): not before the GET, nor a fault at a time."""
        dest = np.frombuffer(buf, np.uint8)

        def into(pos: int, chunk: memoryview) -> None:
            end = pos + len(chunk)
            prefault(buf[pos:end])
            dest[pos:end] = np.frombuffer(chunk, np.uint8)  # numpy copies without the GIL
            each(pos, buf[pos:end])

        return self.stream(name, len(buf), into)

    def _get(self, name: str, *, head: bool = False) -> Any:
        """One GET of ``name``, its bytes not yet read (a HEAD with ``head``); None if absent."""
        import obstore  # lazy: the optional [s3] extra

        try:
            return (obstore.head if head else obstore.get)(self._store, name)
        except FileNotFoundError as e:
            if objecterrors.permanent(e):  # the bucket itself is missing, not the object
                raise self._failed("reading", name, e) from None
            return None

    def _head(self, name: str) -> Any:
        """The object's metadata (its size and ETag), none of its bytes; None if absent."""
        return self._idempotent("reading", name, lambda: self._get(name, head=True))

    def size(self, name: str) -> int | None:
        meta = self._head(check_object_name(name))
        return None if meta is None else int(meta["size"])

    def read_range(self, name: str, start: int, length: int) -> bytes:
        import obstore  # lazy: the optional [s3] extra

        check_object_name(name)
        return self._idempotent(
            "reading",
            name,
            lambda: bytes(obstore.get_range(self._store, name, start=start, length=length)),
        )

    def first_bytes(self, name: str) -> tuple[Any, bytes] | None:
        """The metadata (size, etag) and first ``_HEAD_BYTES`` bytes of
        ``name``, in one ranged GET; None if there is no such object (its
        HEAD agreeing: a 404 it contradicts, or first bytes of another
        length than asked, is an answer that lied, read again)."""
        import obstore  # lazy: the optional [s3] extra
        from obstore.exceptions import GenericError

        check_object_name(name)

        def first() -> tuple[Any, bytes] | None:
            try:
                result = obstore.get(self._store, name, options={"range": (0, _HEAD_BYTES)})
                head = bytes(result.bytes())
            except FileNotFoundError as e:
                if objecterrors.permanent(e):  # the bucket itself is missing, not the object
                    raise self._failed("reading", name, e) from None
                self._confirmed(name, 0, None)  # Contradicted if its HEAD finds it
                return None
            except GenericError as e:
                if objecterrors.status(e) != "416":
                    raise
                refused = e
            else:
                asked = min(_HEAD_BYTES, int(result.meta["size"]))
                if len(head) != asked:
                    where, more = self.where(name), len(head) > asked
                    raise objecterrors.stream_size(name, where, asked, len(head), more=more, at=0)
                return result.meta, head
            try:  # an empty object has no first byte to ask for
                meta = obstore.head(self._store, name)
            except FileNotFoundError:
                return None
            if meta["size"] != 0:  # the 416 was not for an empty object: the error stands
                raise refused
            return meta, b""

        return self._idempotent("reading", name, first)

    def stream_range(
        self, name: str, span: tuple[int, int], pin: Pin, each: Callable[[memoryview], None]
    ) -> None:
        """Streams the bytes ``[start, stop)`` of ``name`` to ``each`` in
        order, by one GET carrying ``If-Match: pin.etag`` (its strong form,
        ``etags.condition``: a weak one is refused; with none, ``_refused``
        first pins the HEAD's); after a failure
        another GET asks for the rest, from where the bytes handed over
        ended (``_idempotent``: an answer that lies, a body that ends short
        of its range or runs past it (``download.hand_over``), a 404 its
        HEAD contradicts, or a 412 its HEAD and the first bytes tell to be
        a lie (``_refused``), is read again as a 5xx is).

        Raises:
          FormatError: when the object no longer has that etag (it was
            replaced while it was read).
          StorageError: naming the object, after the last try.
        """
        import obstore  # lazy: the optional [s3] extra
        from obstore.exceptions import PreconditionError

        check_object_name(name)
        pos, stop = span

        def handed(_: int, part: memoryview) -> None:
            nonlocal pos
            each(part)
            pos += len(part)

        def rest() -> None:
            etag = etags.condition(pin.etag)
            if etag is None:  # nothing pins the object: the HEAD's ETag may
                raise self._refused(name, pin)
            options: Any = {"range": (pos, stop), "if_match": etag}
            try:
                result = obstore.get(self._store, name, options=options)
            except FileNotFoundError as e:  # gone, or a 404 its HEAD contradicts
                if objecterrors.permanent(e) or self._confirmed(name, 0, None) is None:
                    raise self._failed("reading", name, e) from None
            except PreconditionError:
                raise self._refused(name, pin) from None
            pin.sure = True
            parts = result.stream(min_chunk_size=_STREAM_CHUNK)
            hand_over(parts, stop - pos, handed, name=name, where=self.where(name), at=pos)

        self._idempotent("reading", name, rest, lambda: pos)

    def _refused(self, name: str, pin: Pin) -> Exception:
        """Why a GET carrying ``If-Match: pin.etag`` was answered 412 (or
        none could: no ETag), as the object's HEAD tells. An answer that
        lied (``Contradicted``, read again): the HEAD has that ETag (the 412
        lied), or none (``no_etag``), or the server never confirmed
        ``pin.etag`` and the object's first bytes, read again under the
        HEAD's ETag, are ``pin.head`` (the first answer's ETag
        lied; ``pin`` takes the HEAD's, which that read confirmed). Else a
        ``FormatError``: the object was replaced (or removed) while it was
        read, and no byte of two objects is mixed."""
        meta = self._head(name)
        now = None if meta is None else etags.condition(meta.get("e_tag"))
        where = self.where(name)
        if meta is not None and now is None:
            return objecterrors.no_etag(name, where)
        if now is not None and etags.same_object(now, pin.etag):
            return objecterrors.etag_contradicts(name, where, first=False)
        if now is not None and not pin.sure and self._begins(name, now, pin.head) is not None:
            pin.etag, pin.sure = now, True
            return objecterrors.etag_contradicts(name, where, first=True)
        return FormatError(
            "the object was replaced while it was read",
            context=where,
            hint="something else writes under the store's prefix; read it again",
        )

    def _begins(self, name: str, etag: str, head: bytes) -> Any:
        """The metadata of ``name`` if, while its ETag is ``etag``, it begins
        with ``head``: one ranged GET carrying ``If-Match: etag`` (None
        after a 412 or a 404, or for other bytes; first bytes of another
        length than asked are an answer that lied)."""
        import obstore  # lazy: the optional [s3] extra
        from obstore.exceptions import PreconditionError

        options: Any = {"range": (0, len(head)), "if_match": etag}
        try:
            result = obstore.get(self._store, name, options=options)
            got = bytes(result.bytes())
        except (FileNotFoundError, PreconditionError):
            return None
        if len(got) != len(head):
            more = len(got) > len(head)
            raise objecterrors.stream_size(
                name, self.where(name), len(head), len(got), more=more, at=0
            )
        return result.meta if got == head else None

    def list(self, prefix: str) -> list[str]:
        import obstore  # lazy: the optional [s3] extra

        base = check_object_name(prefix) + "/" if prefix else ""

        def names() -> list[str]:
            found = obstore.list_with_delimiter(self._store, base or None)
            out = [p["path"][len(base) :] for p in found["objects"]]
            out += [p[len(base) :].rstrip("/") for p in found["common_prefixes"]]
            return sorted(n for n in out if n)  # never the prefix itself (a folder's marker)

        return self._idempotent("listing", prefix or "/", names)

    def _objects(self, prefix: str) -> Sequence[Any]:
        """The metadata of the objects directly under ``prefix`` (one listing)."""
        import obstore  # lazy: the optional [s3] extra

        base = check_object_name(prefix) + "/"

        def objects() -> Sequence[Any]:
            found = obstore.list_with_delimiter(self._store, base)["objects"]
            return [o for o in found if o["path"][len(base) :]]  # never the prefix itself

        return self._idempotent("listing", prefix, objects)

    def total_size(self, prefix: str) -> int:
        """The bytes of the objects directly under ``prefix`` (one listing)."""
        return sum(int(o["size"]) for o in self._objects(prefix))

    def modified(self, prefix: str) -> dict[str, float]:
        """When each object directly under ``prefix`` was last written: its
        ``LastModified``, in seconds since the epoch by the server's clock
        (one listing)."""
        base = len(prefix) + 1
        return {o["path"][base:]: o["last_modified"].timestamp() for o in self._objects(prefix)}

    def now(self) -> float:
        """The server's clock now, in seconds since the epoch: the
        ``LastModified`` of an empty object written under ``clock/`` with a
        random name, read back and deleted at once (never the client's
        clock, which may differ).

        Raises:
          StorageError: for a write the server acknowledged and did not make.
        """
        name = f"{CLOCK}/{secrets.token_hex(8)}"
        try:
            self.create(name, b"")  # confirmed by reading it back; a random name is never taken
            meta = self._head(name)
        finally:
            self.delete(name)
        if meta is None:
            raise objecterrors.unconfirmed(name, self.where(name), None, found=False)
        return float(meta["last_modified"].timestamp())

    def delete(self, name: str) -> None:
        import obstore  # lazy: the optional [s3] extra

        check_object_name(name)
        self._idempotent("deleting", name, lambda: obstore.delete(self._store, name))
