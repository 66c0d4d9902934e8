"""The storage protocol on object storage (S3 and GCS), through ``obstore``.

``s3://bucket/prefix`` and ``gs://bucket/prefix`` name a store's objects
under a prefix. Every write is conditional, so no lock server is needed:

- ``create`` is a PUT with ``If-None-Match: *`` (a 412 is
  ``Conflict.EXISTS``);
- ``swap`` is a PUT with ``If-Match: <etag>`` (on GCS, the generation), or
  a create when the object was absent (a 412 is ``Conflict.CHANGED``).

Credentials, region and endpoint come from the standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``GOOGLE_*`` for GCS), read by the
client; they are never put in a message. A failure of the network or the
server (refused, timed out, 5xx) is a ``StorageError`` naming the
operation and the object. Only idempotent operations (reads, lists,
deletes) are retried; a conditional write is tried once, since a retry
after a lost answer would report the writer's own success as a conflict.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import FormatError, StorageError, StoreError
from .storage import Conflict, check_object_name

#: The URL schemes this backend serves.
SCHEMES = ("s3", "gs")
#: How many times an idempotent request is tried, and the first pause between tries.
_TRIES = 3
_PAUSE = 0.2
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,220}$")
_URL_RE = re.compile(r"^(s3|gs):/")
#: The least bytes a streamed read hands over at a time.
_STREAM_CHUNK = 4 << 20
#: The first bytes of an object fetched (and kept) on its first read: a
#: checkpoint's header, parsed more than once, in one request.
_HEAD_BYTES = 64 << 10
_STATUS_RE = re.compile(r"status code: (\d{3})")
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
        text = str(e)
        status = _STATUS_RE.search(text)
        if status:
            why = f"the server answered {status.group(1)}"
        elif "error sending request" in text or "onnection refused" in text:
            why = "the connection failed"
        elif "timed out" in text:
            why = "it timed out"
        else:
            why = type(e).__name__
        return StorageError(
            f"{operation} {name} failed: {why}",
            context=f"{self.url}/{name.lstrip('/')}",
            hint="check that the server is reachable and the credentials in the environment "
            "allow it; the store was left as it was",
        )

    def _idempotent(self, operation: str, name: str, call: Callable[[], _T]) -> _T:
        from obstore.exceptions import BaseError, GenericError  # lazy: the optional [s3] extra

        pause = _PAUSE
        for attempt in range(_TRIES):
            try:
                return call()
            except GenericError as e:  # the network or a 5xx: worth another try
                if attempt == _TRIES - 1:
                    raise self._failed(operation, name, e) from None
            except (BaseError, OSError) as e:  # refused by the server: no retry helps
                raise self._failed(operation, name, e) from None
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _tag(meta: Any) -> str:
        return f"{meta.get('e_tag') or ''}|{meta.get('version') or ''}"

    def _put(self, name: str, data: bytes, mode: Any, lost: Conflict) -> str | Conflict:
        import obstore  # lazy: the optional [s3] extra
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            got = obstore.put(self._store, name, data, mode=mode, use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            return lost
        except FileNotFoundError:
            if mode == "create":
                raise self._failed("writing", name, FileNotFoundError("no such bucket")) from None
            return lost  # replacing an object that is gone
        except (obstore.exceptions.BaseError, OSError) as e:
            raise self._failed("writing", name, e) from None
        return self._tag(got)

    def create(self, name: str, data: bytes) -> str | Conflict:
        return self._put(check_object_name(name), data, "create", Conflict.EXISTS)

    def swap(self, name: str, data: bytes, expected: str | None) -> str | Conflict:
        check_object_name(name)
        if expected is None:
            got = self._put(name, data, "create", Conflict.CHANGED)
            return got
        e_tag, _, version = expected.partition("|")
        mode = {"e_tag": e_tag} | ({"version": version} if version else {})
        return self._put(name, data, mode, Conflict.CHANGED)

    def read(self, name: str, *, limit: int, what: str) -> tuple[bytes, str] | None:
        import obstore  # lazy: the optional [s3] extra

        check_object_name(name)

        def get() -> tuple[bytes, str] | None:
            try:
                result = obstore.get(self._store, name)
            except FileNotFoundError:
                return None
            if result.meta["size"] > limit:
                raise StoreError(
                    f"the {what} is {result.meta['size']} bytes, more than the {limit} allowed",
                    context=self.where(name),
                    hint="the store writes this object itself; restore it from a backup",
                )
            return bytes(result.bytes()), self._tag(result.meta)

        return self._idempotent("reading", name, get)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        import obstore  # lazy: the optional [s3] extra

        check_object_name(name)
        return self._idempotent(
            "reading",
            name,
            lambda: bytes(obstore.get_range(self._store, name, start=start, length=length)),
        )

    def reader(self, name: str) -> ObjectReader | None:
        """A ``RangeReader`` of one object, or None if there is no such
        object. Its first bytes, size and etag come in one ranged GET."""
        import obstore  # lazy: the optional [s3] extra
        from obstore.exceptions import GenericError

        check_object_name(name)

        def first() -> tuple[Any, bytes] | None:
            try:
                result = obstore.get(self._store, name, options={"range": (0, _HEAD_BYTES)})
                return result.meta, bytes(result.bytes())
            except FileNotFoundError:
                return None
            except GenericError as e:
                if "416" not in str(e):
                    raise
            try:  # an empty object has no first byte to ask for
                return obstore.head(self._store, name), b""
            except FileNotFoundError:
                return None

        found = self._idempotent("reading", name, first)
        return None if found is None else ObjectReader(self, name, *found)

    def list(self, prefix: str) -> list[str]:
        import obstore  # lazy: the optional [s3] extra

        base = check_object_name(prefix) + "/" if prefix else ""

        def names() -> list[str]:
            found = obstore.list_with_delimiter(self._store, base or None)
            out = [p["path"][len(base) :] for p in found["objects"]]
            out += [p[len(base) :].rstrip("/") for p in found["common_prefixes"]]
            return sorted(out)

        return self._idempotent("listing", prefix or "/", names)

    def delete(self, name: str) -> None:
        import obstore  # lazy: the optional [s3] extra

        check_object_name(name)
        self._idempotent("deleting", name, lambda: obstore.delete(self._store, name))


class ObjectReader:
    """One object's bytes at any offset, for the hashing engine and the
    checkpoint reader (a ``hashing.RangeReader``), fetched as they are read.

    Its first bytes come with its size and etag, in the one request that
    makes it (``ObjectStorage.reader``), and are kept: a header is parsed
    more than once. A read elsewhere is served by a streamed GET, each
    chunk copied once into the caller's buffer as it arrives, and a read
    that continues where the last one ended continues the same stream: a
    whole checkpoint is one GET of its data. A GET runs to the end of the
    planned range it starts in (``plan``), to the end of the object when
    there is no plan, or covers only the bytes asked for when the read lies
    outside every planned range. Every GET carries ``If-Match`` with the
    etag read when the reader was made, so an object replaced meanwhile
    fails the read (``FormatError``) instead of mixing two objects.
    """

    def __init__(self, storage: ObjectStorage, name: str, meta: Any, head: bytes) -> None:
        self._storage = storage
        self._name = name
        self._size = int(meta["size"])
        self._etag = meta.get("e_tag")
        self._head = head
        self._plan: Sequence[tuple[int, int]] | None = None
        self._stream: Iterator[Any] | None = None
        self._pos = 0
        self._left = memoryview(b"")
        #: how many bytes the server sent so far, in every request
        self.fetched = len(head)

    def size(self) -> int:
        return self._size

    def plan(self, ranges: Sequence[tuple[int, int]] | None) -> None:
        """The ``(offset, length)`` ranges the next reads will cover (None:
        read to the end of the object; empty: fetch only what each read asks)."""
        self._plan = ranges
        self.close()

    def close(self) -> None:
        """Drops the open stream, if any (its connection is closed)."""
        self._stream, self._left = None, memoryview(b"")

    def pread_into(self, buf: memoryview, offset: int) -> int:
        want = max(0, min(len(buf), self._size - offset))
        if offset + want <= len(self._head):
            buf[:want] = self._head[offset : offset + want]
            return want
        if self._stream is None or offset != self._pos:
            self._open(offset, want)
        done = 0
        while done < want:
            if not self._left:
                chunk = self._next()
                if chunk is None:
                    break
                self._left = memoryview(chunk)
                self.fetched += len(self._left)
            n = min(len(self._left), want - done)
            buf[done : done + n] = self._left[:n]
            self._left = self._left[n:]
            done += n
        self._pos = offset + done
        return done

    def _stop(self, offset: int, want: int) -> int:
        if self._plan is None:
            return self._size
        for start, length in self._plan:
            if start <= offset < start + length:
                return max(start + length, offset + want)
        return offset + want

    def _options(self, start: int, stop: int) -> Any:
        options: Any = {"range": (start, stop)}
        if self._etag:
            options["if_match"] = self._etag
        return options

    def _open(self, offset: int, want: int) -> None:
        import obstore  # lazy: the optional [s3] extra

        self.close()
        stop = self._stop(offset, want)
        if stop <= offset:
            return
        result = self._call(
            lambda: obstore.get(
                self._storage._store, self._name, options=self._options(offset, stop)
            )
        )
        self._stream = iter(result.stream(min_chunk_size=_STREAM_CHUNK))
        self._pos = offset

    def _next(self) -> Any:
        if self._stream is None:
            return None
        stream = self._stream
        return self._call(lambda: next(stream, None))

    def _call(self, call: Callable[[], _T]) -> _T:
        """One request (not retried: a stream cannot be resumed in place);
        an object replaced since the reader was made is a ``FormatError``."""
        from obstore.exceptions import BaseError, PreconditionError  # lazy: the [s3] extra

        try:
            return call()
        except PreconditionError:
            raise FormatError(
                "the object was replaced while it was read",
                context=self._storage.where(self._name),
                hint="something else writes under the store's prefix; read it again",
            ) from None
        except (BaseError, OSError) as e:
            raise self._storage._failed("reading", self._name, e) from None
