"""Tensors stored once per content: a ``tensors`` version's manifest, the
store's shared tensor objects, and gc of the objects no version refers to.

The same names through the ``Storage`` protocol on a disk and in a bucket::

    ROOT/tensors/ALGO-HEX[.TOKEN]    one tensor's bytes (HEX: its digest),
                                     create-only, never rewritten
    ROOT/doomed/OBJECT               gc's mark, made before it deletes
                                     OBJECT; while it stands, no put
                                     reuses OBJECT
    ROOT/versions/NAME/tensors.json  the manifest: the checkpoint's header
                                     (its text, as in the file; its digest,
                                     ``treeguard.digest``, covers every
                                     tensor's digest, dtype and shape), the
                                     file's size, and the object that holds
                                     each tensor, in the header's order

A version's digest is its header digest, the same as that of the one file
``save`` writes for the same tree, so a verdict binds it as it binds a file
version's, and ``tensorread.py`` reads the version as that file, every
tensor hashed.

Why a tensor that a version refers to is never deleted: gc lists the
objects, reads every manifest (every name under ``versions/``, finished or
being written), marks each object no manifest names ``doomed/``, reads
every manifest again, and deletes only the marked objects still named by
none. A put writes its tensors and its manifest (a local put links its
new objects while its manifest is written: tensorput.py), then reads
``doomed/`` and, if one of its objects is marked, takes its manifest back
and starts again (the objects marked are not reused); only then does it
write its record. A manifest gc's second reading missed was written after
that reading, so after the mark, and its put sees the mark (whenever its
objects were linked: gc deletes only objects it listed).

When a mark is cleared: the mark of a deleted object stays for good (a put
whose manifest names it may not have read ``doomed/`` yet, and no object is
made again under its name). A gc that runs alone (a local store's, under
the store's lock: ``sweep(exclusive=True)``) clears, after its deletions,
the mark of every object it listed, did not delete and found named by its
last reading: the objects a put named in time (spared), and those a gc
killed between its mark and its deletions left marked. Why no put can lose
such an object: a mark matters only to the gc that relies on it to delete
the object; the objects cleared exist and this gc deletes none of them, and
no other gc runs meanwhile; a gc that comes later deletes an object only
after a mark of its own, made before its second reading, and a put that
names the object after that reading reads ``doomed/`` after its manifest,
so sees that mark, as above. A put that listed ``doomed/`` before the mark
was cleared writes the tensor again under a fresh name: wasteful, never
wrong. In a bucket two gcs may run at once, and one could clear a mark the
other relies on, so a bucket's gc clears none: an object it spared is not
reused, and a later gc deletes it once no version names it.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import strictjson
from ..checkpoint import Header
from ..checkpoint.files import read_raw_header
from ..checkpoint.format import MAX_HEADER_BYTES
from ..checkpoint.read import checked_header
from ..checkpoint.write import Draft
from ..errors import FormatError, StoreError
from ..hashing import BytesReader, digest, memo
from .layout import check_name
from .storage import Conflict, Storage

#: The manifest of a ``tensors`` version, in its directory.
TENSORS_FILE = "tensors.json"
TENSORS_FORMAT = "treeguard.tensors/1"
#: Where the tensor objects are, and gc's marks.
AREA = "tensors"
DOOMED = "doomed"
#: The most bytes a manifest may have: a header and its list of objects.
MANIFEST_LIMIT = 3 * MAX_HEADER_BYTES
#: How many times a put starts again when gc marked one of its objects.
PUT_TRIES = 16

OBJECT_RE = re.compile(r"^(blake3|sha256)-[0-9a-f]{64}(\.[0-9a-f]{16})?$")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A ``tensors`` version's manifest.

    Attributes:
      prefix: the first bytes of the file it stands for (the 8-byte length
        and the header).
      size: that file's size.
      objects: the object holding each tensor, in the header's order.
    """

    prefix: bytes
    size: int
    objects: tuple[str, ...]


def manifest_bytes(prefix: bytes, size: int, objects: list[str]) -> bytes:
    """The manifest of a version whose file starts with ``prefix``."""
    doc = {
        "format": TENSORS_FORMAT,
        "size": size,
        "header": bytes(prefix[8:]).decode("utf-8"),
        "objects": objects,
    }
    return (strictjson.dumps(doc) + "\n").encode("utf-8")


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """A manifest's bytes, validated.

    Raises:
      FormatError: for one that is not a ``treeguard.tensors/1`` manifest.
    """
    doc = strictjson.loads(raw, "the tensors manifest", context=where)
    ok = (
        isinstance(doc, dict)
        and doc.get("format") == TENSORS_FORMAT
        and isinstance(doc.get("size"), int)
        and not isinstance(doc.get("size"), bool)
        and isinstance(doc.get("header"), str)
        and isinstance(doc.get("objects"), list)
        and all(isinstance(n, str) and OBJECT_RE.match(n) for n in doc["objects"])
    )
    if not ok:
        raise FormatError(
            f"not a {TENSORS_FORMAT} manifest",
            context=where,
            hint="the store writes it itself; restore the version from a backup",
        )
    header = doc["header"].encode("utf-8")
    return Manifest(len(header).to_bytes(8, "little") + header, doc["size"], tuple(doc["objects"]))


def header_of(prefix: bytes | memoryview, size: int, where: str) -> Header:
    """The header of a checkpoint of ``size`` bytes that starts with
    ``prefix`` (its 8-byte length and its header), checked as a load checks it."""
    return checked_header(*read_raw_header(BytesReader(prefix, size=size), where), where, None)


def usable_objects(storage: Storage) -> tuple[dict[str, str], set[str]]:
    """The objects a put may name, by ``ALGO-HEX`` (none gc marked), and
    every name taken (a new object takes none of them)."""
    held = [n for n in storage.list(AREA) if OBJECT_RE.match(n)]
    doomed = set(storage.list(DOOMED))
    usable: dict[str, str] = {}
    for name in sorted(held):
        if name not in doomed:
            usable.setdefault(name.split(".")[0], name)
    return usable, set(held) | doomed


def leaves_to_hash(
    draft: Draft, known: Sequence[str | None], usable: dict[str, str]
) -> Iterator[tuple[int, str | memoryview]]:
    """Each leaf of ``draft`` in order with, when the memo knew its digest
    (``known``) and a usable object holds its bytes, that digest: the leaf
    is neither brought to the host nor hashed; else its bytes on the host,
    for the caller to hash (the next such leaf's copy from its device runs
    meanwhile). The one walk both puts (``write_missing``, tensorput.py)
    make over a tree."""
    algorithm = draft.algorithm
    todo = [i for i, d in enumerate(known) if d is None or f"{algorithm}-{d}" not in usable]
    for i, remembered in enumerate(known):
        if remembered is not None and f"{algorithm}-{remembered}" in usable:
            yield i, remembered
            continue
        at = bisect.bisect_right(todo, i)
        if at < len(todo):
            draft.prefetch(todo[at])  # its copy from its device runs meanwhile
        yield i, draft.host_bytes(i)


def write_missing(
    storage: Storage,
    draft: Draft,
    known: Sequence[str | None],
    then: Callable[[list[str]], None] = lambda _: None,
) -> tuple[list[str], list[str]]:
    """Writes each leaf of ``draft`` that no usable object holds yet; returns
    the object and the digest of every leaf, in order. A leaf whose digest
    the memo knows (``known``) and whose object the store holds is neither
    brought to the host nor hashed; every other leaf is, and is written if
    no usable object holds its bytes. ``then(digests)`` is called once every
    digest is known, before the last object is written (the header is laid
    out meanwhile). An object gc marked is never reused, and a name taken by
    other bytes is left for a fresh one."""
    usable, taken = usable_objects(storage)
    algorithm = draft.algorithm
    digests: list[str] = []
    pending: tuple[str, memoryview] | None = None  # written once the next is hashed
    for _, got in leaves_to_hash(draft, known, usable):
        found = got if isinstance(got, str) else digest(got, algorithm)
        base = f"{algorithm}-{found}"
        fresh = pending is None or pending[0] != base
        if not isinstance(got, str) and base not in usable and fresh:
            if pending is not None:
                usable[pending[0]] = _create(storage, *pending, taken)
            pending = (base, got)
        digests.append(found)
    then(digests)
    if pending is not None:
        usable[pending[0]] = _create(storage, *pending, taken)
    return [usable[f"{algorithm}-{d}"] for d in digests], digests


def _create(storage: Storage, base: str, data: memoryview, taken: set[str]) -> str:
    name = base if base not in taken else f"{base}.{secrets.token_hex(8)}"
    while isinstance(storage.create(f"{AREA}/{name}", data), Conflict):
        name = f"{base}.{secrets.token_hex(8)}"  # made meanwhile: its bytes are not known
    return name


def doomed_among(storage: Storage, objects: list[str]) -> bool:
    """Whether gc marked one of ``objects`` (read after the manifest is written)."""
    return bool(set(storage.list(DOOMED)) & set(objects))


def put(
    storage: Storage,
    draft: Draft,
    place: Callable[[bytes, list[str], Header], bool],
    where: str,
    carried: memo.Carried | None = None,
) -> Header:
    """Writes a version's tensors that the store does not hold (the digest
    memo names the leaves a verified load handed back, which are not read
    again: ``hashing/memo.py``; ``carried`` the digests a host copy of
    such leaves carries, for a non-blocking put) and hands its manifest, objects and header
    to ``place``, which writes the manifest, then (by ``doomed_among``)
    takes it back and returns False if gc marked one of the objects;
    started again while it does. The header is laid out and read back on a
    thread of its own while the last object is written.

    Raises:
      StoreError: if gc kept marking its objects, ``PUT_TRIES`` times.
    """
    lookup = memo.known if carried is None else carried.known
    known: list[str | None] = [lookup(x, draft.algorithm) for x in draft.leaves]
    signed: list[Future[tuple[bytes, Header]]] = []
    with ThreadPoolExecutor(1, thread_name_prefix="treeguard-header") as pool:
        for _ in range(PUT_TRIES):
            objects, digests = write_missing(
                storage,
                draft,
                known,
                lambda found: signed.append(pool.submit(_signed, draft, found, where)),
            )
            known = list(digests)  # each the digest of the leaf's bytes, hashed or remembered
            prefix, header = signed[-1].result()
            if place(manifest_bytes(prefix, header.file_bytes, objects), objects, header):
                return header
    raise gc_kept_marking(where)


def gc_kept_marking(where: str) -> StoreError:
    """The error of a put that gc's marks sent back ``PUT_TRIES`` times."""
    return StoreError(
        f"gc removed this version's tensors {PUT_TRIES} times in a row while it was put",
        context=where,
        hint="put it again once gc is done",
    )


def _signed(draft: Draft, digests: list[str], where: str) -> tuple[bytes, Header]:
    """The first bytes of the version's file (its header with ``digests``),
    and that header read back as a load reads it."""
    prefix = len(draft.draft).to_bytes(8, "little") + draft.header(digests)
    return prefix, header_of(prefix, draft.file_bytes, where)


def referenced(storage: Storage) -> set[str] | None:
    """Every object a manifest under ``versions/`` names; None when one
    cannot be read (then gc deletes no tensor)."""
    out: set[str] = set()
    for name in storage.list("versions"):
        try:
            check_name(name)
        except StoreError:
            continue
        target = f"versions/{name}/{TENSORS_FILE}"
        try:
            found = storage.read(  # a 404 its HEAD contradicts: no tensor of it is taken
                target, limit=MANIFEST_LIMIT, what="tensors manifest", confirm_missing=True
            )
            if found is not None:
                out.update(parse_manifest(found[0], storage.where(target)).objects)
        except (FormatError, StoreError, OSError):
            return None
    return out


def sweep(
    storage: Storage,
    *,
    exclusive: bool = False,
    young: Callable[[], set[str]] = set,
) -> list[str] | None:
    """Deletes the tensor objects no manifest names (see the module); the
    objects deleted, or None when a manifest could not be read and
    nothing was deleted. ``exclusive``: no other gc runs meanwhile, so the
    marks of the objects kept that a version names are cleared.
    ``young``: the objects too young to delete (a put may have written
    them and not yet its manifest), read after the objects are listed."""
    held = [n for n in storage.list(AREA) if OBJECT_RE.match(n)]
    if not held:
        return []
    first = referenced(storage)
    if first is None:
        return None
    unnamed = [n for n in held if n not in first]
    spared = young() if unnamed else set()
    doomed = [n for n in unnamed if n not in spared]
    for name in doomed:
        storage.create(f"{DOOMED}/{name}", b"")  # one made already stands
    again = referenced(storage) if doomed else first
    if again is None:
        return None
    removed = [n for n in doomed if n not in again]
    for name in removed:
        storage.delete(f"{AREA}/{name}")
    if exclusive:
        marked = set(storage.list(DOOMED))
        for name in held:
            if name in again and name in marked:  # listed, not deleted, named
                storage.delete(f"{DOOMED}/{name}")
    return removed


def summary(removed: list[str] | None) -> dict[str, Any]:
    """What gc's log says of its sweep."""
    if removed is None:
        return {"tensors_kept": "a manifest could not be read"}
    return {"tensors_removed": len(removed)}
