"""Reading a ``tensors`` version (tensors.py) as the one checkpoint file it
stands for: ``TensorsReader`` is a ``hashing.RangeReader`` whose first bytes
are the manifest's header and whose data are the tensor objects, each
opened on its first read, so every checkpoint reader (``load_source``,
``verify_source``, an export's copy) reads it unchanged and hashes every
tensor it returns against the header. An object that is missing or of
another size is an ``IntegrityError`` naming the tensor before any of its
bytes is used; bytes that hash wrong are one too, from the reader.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from ..atomic import open_regular
from ..checkpoint import Header
from ..checkpoint.files import read_raw_header
from ..checkpoint.format import TensorInfo
from ..checkpoint.read import checked_header
from ..errors import IntegrityError
from ..hashing import Source, pread_into, source_size
from .tensors import AREA, Manifest

#: Opens one tensor object by name: its ``Source``, or None if there is none.
Opener = Callable[[str], Source | None]

_HINT = "do not use this version; put the weights again, or restore the object from a backup"


class TensorsReader:
    """A ``tensors`` version's bytes, as the checkpoint file they stand for.

    Args:
      manifest: the version's manifest.
      open_object: opens a tensor object by name.
      where: the version's location, for messages.
    """

    def __init__(self, manifest: Manifest, open_object: Opener, where: str) -> None:
        self._manifest = manifest
        self._open_object = open_object
        self._where = where
        self._starts: list[int] = []
        self._tensors: list[TensorInfo] = []
        self._opened: dict[int, Source] = {}
        self._lock = threading.Lock()

    def attach(self, header: Header) -> None:
        """Places each tensor's object at its offset in the file."""
        if len(header.tensors) != len(self._manifest.objects):
            raise IntegrityError(
                f"the manifest names {len(self._manifest.objects)} objects for "
                f"{len(header.tensors)} tensors",
                context=self._where,
                hint=_HINT,
            )
        for t, name in zip(header.tensors, self._manifest.objects):
            if name.split(".")[0] != f"{header.hash_name}-{t.digest}":
                raise IntegrityError(
                    f"the manifest names object {name} for a tensor of another digest",
                    path=t.name,
                    context=self._where,
                    hint=_HINT,
                )
        self._tensors = list(header.tensors)
        self._starts = [header.data_start + t.begin for t in header.tensors]

    def size(self) -> int:
        return self._manifest.size

    def _source(self, i: int) -> Source:
        with self._lock:
            if i in self._opened:
                return self._opened[i]
            t, name = self._tensors[i], self._manifest.objects[i]
            src = self._open_object(name)
            if src is None:
                raise IntegrityError(
                    f"tensor {t.name}: its object {AREA}/{name} is missing",
                    path=t.name,
                    context=self._where,
                    hint=_HINT,
                )
            held = source_size(src)
            if held != t.nbytes:
                _close(src)
                raise IntegrityError(
                    f"tensor {t.name}: its object {AREA}/{name} holds {held} "
                    f"bytes, not the {t.nbytes} of {t.summary()}",
                    path=t.name,
                    context=self._where,
                    hint=_HINT,
                )
            self._opened[i] = src
            return src

    def pread_into(self, buf: memoryview, offset: int) -> int:
        done, prefix = 0, self._manifest.prefix
        while done < len(buf) and offset + done < self._manifest.size:
            at = offset + done
            if at < len(prefix):
                n = min(len(buf) - done, len(prefix) - at)
                buf[done : done + n] = prefix[at : at + n]
            else:
                i = bisect.bisect_right(self._starts, at) - 1
                if i < 0 or at >= self._starts[i] + self._tensors[i].nbytes:
                    return done  # past the last tensor
                n = min(len(buf) - done, self._starts[i] + self._tensors[i].nbytes - at)
                n = pread_into(self._source(i), buf[done : done + n], at - self._starts[i])
                if n == 0:
                    return done
            done += n
        return done

    def close(self) -> None:
        """Closes every object opened."""
        with self._lock:
            for src in self._opened.values():
                _close(src)
            self._opened.clear()


def _close(src: Source) -> None:
    if isinstance(src, int):
        os.close(src)
    else:
        close = getattr(src, "close", None)
        if close is not None:
            close()


@contextlib.contextmanager
def opened(
    manifest: Manifest, open_object: Opener, where: str
) -> Iterator[tuple[TensorsReader, Header]]:
    """The version's reader and its header (parsed from the manifest alone)."""
    reader = TensorsReader(manifest, open_object, where)
    try:
        header = checked_header(*read_raw_header(reader, where), where, None)
        reader.attach(header)
        yield reader, header
    finally:
        reader.close()


def local_opener(root: str) -> Opener:
    """Opens tensor objects under a local store's ``tensors/`` (regular
    files only, no link followed)."""
    area = os.path.join(root, AREA)
    if os.path.islink(area):
        raise IntegrityError(
            f"{AREA} is a link; the store never follows links", context=root, hint=_HINT
        )

    def open_object(name: str) -> Source | None:
        try:
            return open_regular(os.path.join(area, name), what="tensor object")
        except FileNotFoundError:
            return None

    return open_object
