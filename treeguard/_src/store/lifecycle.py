"""What moves a store's pointer and what removes its versions: ``promote``,
``rollback``, ``repair`` and ``gc``, written once over a ``Backend``.

Each reads the pointer under the store's damage rule (``pointer.of_store``),
passes every version it makes current through the gates (gates.py), and
replaces the pointer by compare-and-swap on the tag it read, reading it
again when it moved meanwhile (``_POINTER_TRIES`` times). gc decides from
one listing (``listing``) and deletes only what it decided on, after the
fence (``_fence``) that keeps anything current, or that could become
current, from being deleted. ``ArtifactStore`` (store.py) documents each
operation; this module holds how it is done.
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    ConflictError,
    DanglingPointerError,
    FormatError,
    IntegrityError,
    RetiredVersionError,
    StoreError,
    UnknownVersionError,
)
from . import pointer, records, verdicts
from .backend import Backend, record_of
from .gates import gate
from .layout import POINTER_FILE, check_name
from .records import VersionInfo
from .retention import RetentionPolicy
from .signing import VerdictSigner

#: How many former current versions the pointer remembers (and gc keeps).
POINTER_DEPTH = 16
#: How many times an operation reads the pointer again when it moved meanwhile.
_POINTER_TRIES = 32


def previous_verified(backend: Backend, ptr: pointer.Pointer) -> tuple[str | None, tuple[str, ...]]:
    """The most recent former current version whose record says verified,
    and the former ones after it; ``(None, ())`` if there is none."""
    for i, v in enumerate(ptr.previous):
        try:
            if record_of(backend, v)[1]["status"] == "verified":
                return v, ptr.previous[i + 1 :]
        except StoreError:
            continue
    return None, ()


def listing(backend: Backend) -> tuple[list[str], list[VersionInfo]]:
    """One listing of the store: every name that may be a version, and
    the record of each that has one, sorted as ``versions`` returns them
    (a name without a record is a put under way, or one that died)."""
    names = backend.version_names()
    out: list[VersionInfo] = []
    for name in names:
        try:
            location, data = backend.record(name)
        except UnknownVersionError:
            continue  # a put that has not written its record, or a version gc removed
        except (StoreError, FormatError) as e:
            location = backend.storage.where(f"versions/{name}")
            out.append(records.unreadable(name, str(e), location))
            continue
        out.append(records.info(name, location, data))
    listed = sorted(
        out,
        key=lambda v: (
            v.status == records.UNREADABLE,
            -1 if v.seq is None else v.seq,  # an older store's versions come first
            v.created,
            v.version,
        ),
    )
    return names, listed


# -- moving the pointer ----------------------------------------------------


def promote(backend: Backend, signer: VerdictSigner | None, version: str) -> None:
    """``ArtifactStore.promote``. The marker is read once (``_marker``)."""
    check_name(version)
    with backend.locked():
        marker = _marker(backend)
        gate(backend, signer, version, full=True, marker=marker)
        for _ in range(_POINTER_TRIES):
            ptr = pointer.of_store(backend, marker)
            if ptr.current == version:
                return
            _refuse_retired(backend, version)  # after reading the pointer: see gc
            if pointer.write(backend.storage, ptr.promoting(version, POINTER_DEPTH), replacing=ptr):
                break
        else:
            raise _kept_moving(backend.root)
        # after the pointer: from now on a missing pointer is a damaged one (for
        # readers that look at the marker); a kill between the two reads as it is
        if not marker.get("promoted"):
            backend.mark("promoted")
        backend.append("promote", version, {"previous": ptr.current})


def _marker(backend: Backend) -> dict[str, Any]:
    """The marker, read once by a promote or a rollback for the pointer's
    damage rule (``pointer.of_store``) and every gate. Once is enough: what
    they read of it never goes back. Its ``id`` never changes; ``signed``
    and ``promoted`` only ever turn on, so an earlier read can miss only a
    flag set meanwhile, which a second read could miss as well (the gate
    read it at its start, before its long re-read of the bytes, either
    way); and a ``promoted`` set meanwhile comes after its promote's
    pointer, which the pointer read that follows then finds. Only the first
    gate after it takes it: a rollback's later gate reads it again, as a
    gate's read at its start would come after the earlier gate's long
    re-read, in which the store may have been marked signed (a verdict
    unsigned then must be refused without the key)."""
    return backend.require()


def _refuse_retired(backend: Backend, version: str) -> None:
    """Refuses a version whose name gc retired: it is never current again."""
    if backend.retired(version):
        raise RetiredVersionError(
            f"version {version} was retired by gc: it is being removed and is never "
            "made current again",
            version=version,
            context=backend.root,
            hint="put the weights again as a new version, verify it and promote that one",
        )


def rollback(backend: Backend, signer: VerdictSigner | None) -> str:
    """``ArtifactStore.rollback``. The marker is read once for the pointer
    and the first gate (``_marker``); a later gate reads it again."""
    with backend.locked():
        marker: dict[str, Any] | None = _marker(backend)
        for _ in range(_POINTER_TRIES):
            ptr = pointer.of_store(backend, marker)
            skipped: list[str] = []
            for i, v in enumerate(ptr.previous):
                try:
                    gate(backend, signer, v, full=True, marker=marker)
                    _refuse_retired(backend, v)  # after reading the pointer: see gc
                except (StoreError, IntegrityError, FormatError, OSError) as e:
                    skipped.append(f"{v}: {str(e).splitlines()[0]}")
                    continue
                finally:
                    marker = None  # the next gate reads it again, after this one's re-read
                if not pointer.write(
                    backend.storage, pointer.Pointer(v, ptr.previous[i + 1 :]), replacing=ptr
                ):
                    break  # rewritten unchanged meanwhile: read it again
                backend.append("rollback", v, {"previous": ptr.current, "skipped": skipped})
                return v
            else:
                raise pointer.nothing_to_roll_back_to(ptr, skipped, backend.root)
        raise _kept_moving(backend.root)


def repair(backend: Backend, signer: VerdictSigner | None, version: str) -> list[str]:
    """``ArtifactStore.repair``."""
    check_name(version)
    with backend.locked():
        gate(backend, signer, version, full=True)
        _refuse_retired(backend, version)
        old = pointer.salvage(backend.storage)
        held = {v.version for v in listing(backend)[1]}
        keep = [v for v in old.previous if v != version and v in held and not backend.retired(v)]
        dropped = [v for v in (old.current, *old.previous) if v is not None and v not in held]
        dropped += [v for v in old.previous if v in held and v not in keep and v != version]
        if not pointer.write(backend.storage, pointer.Pointer(version, tuple(keep)), replacing=old):
            raise _kept_moving(backend.root)
        backend.mark("promoted")
        backend.append("repair", version, {"previous": old.current, "dropped": dropped})
    return dropped


# -- gc --------------------------------------------------------------------


def gc(backend: Backend, signer: VerdictSigner | None, policy: RetentionPolicy) -> list[str]:
    """``ArtifactStore.gc``."""
    with backend.locked():
        ptr, names, listed = _consistent_view(backend)
        protect = ptr.names() | _kept(backend, signer, policy, listed)
        finished = {v.version for v in listed if v.status in records.FINISHED}
        doomed = [n for n in names if n not in protect]
        for name in doomed:
            if name in finished:  # a writing, unreadable or unrecorded one: remove() decides
                backend.retire(name)
        spared = _fence(backend) if doomed else set()
        removed = [
            n
            for n in doomed
            if n not in spared
            and backend.remove(n, retired=n in finished, grace=policy.orphan_grace_s)
        ]
        backend.after_gc(policy.orphan_grace_s)
        if removed or spared & set(doomed):
            backend.append(
                "gc",
                None,
                {
                    "removed": removed,
                    "keep": policy.keep_last,
                    "spared": sorted(spared & set(doomed)),
                },
            )
    return removed


def _consistent_view(backend: Backend) -> tuple[pointer.Pointer, list[str], list[VersionInfo]]:
    """The pointer and one listing of the store, with every version the
    pointer names held (the listing may not show one made after it).

    Raises:
      DanglingPointerError: for a pointer that names a version the store
        does not hold, twice in a row (never a guess at what is current).
    """
    for _ in range(_POINTER_TRIES):
        ptr = pointer.of_store(backend)  # raises on a damaged pointer: nothing is deleted then
        names, listed = listing(backend)
        present = set(names) | {v.version for v in listed}
        absent = [v for v in ptr.names() if v not in present and not _holds(backend, v)]
        if not absent:
            return ptr, names, listed
        if pointer.of_store(backend) == ptr:  # not a pointer moved under the listing: damage
            which = "as current" if ptr.current in absent else "among the former ones"
            missing = ptr.current if ptr.current in absent else absent[0]
            raise DanglingPointerError(
                f"the pointer names version {missing} {which}, and the store does not "
                "hold it; gc deleted nothing",
                version=missing,
                context=backend.storage.where(POINTER_FILE),
                hint="point the store at a version you choose: "
                f"`treeguard store repair {backend.root} VERSION` (ArtifactStore.repair)",
            )
    raise _kept_moving(backend.root)


def _holds(backend: Backend, version: str) -> bool:
    """Whether the store holds ``version`` now (its record, readable or not)."""
    try:
        backend.record(version)
    except UnknownVersionError:
        return False
    except (StoreError, FormatError):
        return True
    return True


def _fence(backend: Backend) -> set[str]:
    """After gc retired the names it chose: the versions the pointer names
    once it is rewritten unchanged, by compare-and-swap, from a fresh read.

    Why nothing current, or that could become current, is deleted: a
    name enters the pointer only by ``promote`` (which reads the pointer,
    then refuses a retired name, then swaps the pointer on the tag it
    read) or by ``rollback`` (which moves to a name the pointer already
    holds). Every swap is ordered on the pointer. A promote whose swap
    comes before the fence's is seen by the fence's read (or makes the
    fence's swap fail, and the fence reads again); a promote whose swap
    comes after the fence read the pointer after the fence, so after gc
    retired its names, and refuses them. So every pointer from the fence
    on names only versions the fence saw, or versions gc did not retire;
    gc deletes neither. A name gc chose without retiring it (no finished
    record when it listed: a put under way or dead) may be promoted
    after the fence, once its put ends; for those the backend deletes
    only data that still has no record (``remove(retired=False)``).
    """
    for _ in range(_POINTER_TRIES):
        ptr = pointer.of_store(backend)
        try:
            if pointer.write(
                backend.storage, pointer.Pointer(ptr.current, ptr.previous), replacing=ptr
            ):
                return ptr.names()
        except ConflictError:
            continue  # moved by a promote or rollback: read it again
    raise _kept_moving(backend.root)


def _kept(
    backend: Backend,
    signer: VerdictSigner | None,
    policy: RetentionPolicy,
    listed: list[VersionInfo],
) -> set[str]:
    """What ``policy`` keeps of the finished versions ``listed``, and every
    version whose verdict is forged (never counted as verified)."""
    finished = [v for v in listed if v.status in records.FINISHED]
    newest = finished[max(0, len(finished) - policy.keep_last) :] if policy.keep_last else []
    forged = verdicts.forged(backend, signer, finished).keys()
    kept = {v.version for v in newest} | forged
    verified = [v.version for v in finished if v.status == "verified" and v.version not in forged]
    if policy.keep_verified:
        kept.update(verified[-policy.keep_verified :])
    return kept


def _kept_moving(root: str) -> StoreError:
    return StoreError(
        f"the pointer kept moving under {_POINTER_TRIES} tries in a row",
        context=root,
        hint="too many promotes, rollbacks or gcs at once; try again",
    )
