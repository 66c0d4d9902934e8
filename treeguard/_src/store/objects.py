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

import functools
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import StorageError, StoreError
from .storage import Conflict, check_object_name

#: The URL schemes this backend serves.
SCHEMES = ("s3", "gs")
#: How many times an idempotent request is tried, and the first pause between tries.
_TRIES = 3
_PAUSE = 0.2
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,220}$")
_URL_RE = re.compile(r"^(s3|gs):/")
#: The least bytes a streamed read hands over at a time.
_STREAM_CHUNK = 8 << 20
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

    def copy_into(
        self, name: str, fd: int, ranges: Sequence[tuple[int, int]] | None = None
    ) -> int | None:
        """Streams ``name`` (or only its ``(offset, length)`` ranges, one
        ranged GET each) into the file open at ``fd``, each byte at its own
        offset, a chunk at a time: the object is never whole in memory.

        Returns:
          The object's size, or None if there is no such object.

        Raises:
          StorageError: for a failing server, or an object shorter than a range.
        """
        import obstore  # lazy: the optional [s3] extra

        check_object_name(name)
        size: int | None = None

        def copy(start: int, length: int | None) -> int | None:
            options: Any = {} if length is None else {"range": (start, start + length)}
            try:
                result = obstore.get(self._store, name, options=options)
            except FileNotFoundError:
                return None
            at = start
            for chunk in result.stream(min_chunk_size=_STREAM_CHUNK):
                view = memoryview(chunk)
                while view:
                    n = os.pwrite(fd, view, at)
                    view, at = view[n:], at + n
            if length is not None and at != start + length:
                raise StorageError(
                    f"reading {name} failed: the object ended at byte {at}, before the "
                    f"{length} bytes asked for from byte {start}",
                    context=self.where(name),
                    hint="something replaced the object behind the store",
                )
            return int(result.meta["size"])

        for start, length in ranges if ranges is not None else [(0, None)]:
            size = self._idempotent("reading", name, functools.partial(copy, start, length))
            if size is None:
                return None
        return size

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
