"""How ``BucketBackend`` removes versions (gc's primitives, see backend.py):
the record first, then every other object, a sharded version's shards
last; the data of a put that died before its record (a checkpoint object,
a tensors manifest, or a sharded put's shards and manifest) only once
every object of it is older than the grace (grace.py: a put still
uploading is left alone) and after its name is retired; never anything
the store did not write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import FormatError, StoreError, UnknownVersionError
from ..sharded.manifest import MANIFEST_NAME, is_data_name
from . import bucketshards, tensors
from .bucketreads import version_object
from .exported import ARTIFACT_FILE, META_FILE
from .grace import Grace
from .layout import MODEL_FILE, SMALL_FILE_LIMIT, STATUS_FILE
from .objects import CLOCK, ObjectStorage
from .tensors import TENSORS_FILE

VERDICT_FILE = "verdict.json"
#: The objects a version holds; gc leaves a version holding anything else.
OWN_OBJECTS = (
    STATUS_FILE,
    VERDICT_FILE,
    MANIFEST_NAME,
    MODEL_FILE,
    ARTIFACT_FILE,
    META_FILE,
    TENSORS_FILE,
)


class BucketGc:
    """The removals of ``BucketBackend``, over its storage."""

    storage: ObjectStorage
    retired: Callable[[str], bool]
    retire: Callable[[str], None]
    append: Callable[[str, str | None, dict[str, Any]], None]
    _record: Callable[[str], dict[str, Any]]

    # -- gc --------------------------------------------------------------

    def remove(self, version: str, *, retired: bool, grace: float) -> bool:
        """Deletes the record first: the version is gone from the moment its
        record is, and a remove killed after that leaves objects under a
        retired name, which the next gc deletes. A version gc did not retire
        (it had no finished record when gc listed) is never deleted once it
        has a record: only the data of a put that died before its record (a
        checkpoint object, or a sharded put's shards and manifest), and
        only once none of its objects is younger than ``grace`` seconds."""
        held = self._held(version)
        if held is None:
            return False  # objects the store did not write: a person must look
        try:
            self._record(version)
        except UnknownVersionError:
            if held and STATUS_FILE not in held and self.retired(version):
                return self._delete(version, held)  # a remove killed after the record went
            own = {n for n in held if not is_data_name(n)}
            sharded = own != held and own <= {MANIFEST_NAME}
            if own not in ({MODEL_FILE}, {TENSORS_FILE}) and not sharded:
                return False  # nothing there, or a verdict without a record: a person must look
            if self._young(version, held, Grace(self.storage, grace)):
                return False  # its put may still be writing it
            return self._remove_unrecorded(version, held)
        except (StoreError, FormatError):
            return False  # never delete what cannot be read: a person must look
        if not retired:
            return False  # its record appeared after gc listed it: not what gc decided on
        self.retire(version)  # (again) before anything is deleted
        return self._delete(version, held | set(OWN_OBJECTS))

    def _held(self, version: str) -> set[str] | None:
        """What the version holds: its objects and data prefixes; None when
        anything there is not the store's (a data prefix holds shards only)."""
        held = set(self.storage.list(f"versions/{version}"))
        for name in held - set(OWN_OBJECTS):
            if not is_data_name(name):
                return None
            inside = self.storage.list(version_object(version, name))
            if not all(bucketshards.is_shard_name(n) for n in inside):
                return None
        return held

    def _young(self, version: str, held: set[str], grace: Grace) -> bool:
        """Whether an object of ``version`` (one of its own, or a shard under
        one of its data prefixes) is younger than ``grace``."""
        data = [version_object(version, n) for n in sorted(held) if is_data_name(n)]
        return any(grace.young(prefix) for prefix in [f"versions/{version}", *data])

    def _delete(self, version: str, held: set[str]) -> bool:
        """The record first (a version never lacks its data), then every
        other object, the shards last."""
        for leaf in OWN_OBJECTS:
            if leaf in held:
                self.storage.delete(version_object(version, leaf))
        for name in sorted(held - set(OWN_OBJECTS)):
            bucketshards.discard(self.storage, version_object(version, name))
        return True

    def _remove_unrecorded(self, version: str, held: set[str]) -> bool:
        """Removes the data of a put that died before its record.

        The name is retired first; a put still running checks for that after
        writing its record, and undoes itself. If its record appeared
        meanwhile, that put finished first: its version is kept (with its
        name retired, so never made current: put it again to use it). The
        record is looked for before the name is retired too, so only a put
        that finishes inside that window leaves a version so retired."""
        if self._recorded(version):
            return False  # its put finished since gc listed it
        self.retire(version)
        if self._recorded(version):
            return False
        return self._delete(version, held)

    def _recorded(self, version: str) -> bool:
        """Whether ``version`` has a record now; a 404 its HEAD contradicts is
        read again (``confirm_missing``): gc deletes a put's data on its word."""
        status = version_object(version, STATUS_FILE)
        found = self.storage.read(
            status, limit=SMALL_FILE_LIMIT, what="status file", confirm_missing=True
        )
        return found is not None

    def after_gc(self, grace: float) -> None:
        """Deletes the tensor objects no version refers to (tensors.py) once
        older than ``grace`` seconds (a put uploads its tensors before its
        manifest names them); gc deletes whole versions, and leaves no
        temporary objects: it also deletes what an earlier gc, killed between
        the two, left of the objects it reads the bucket's clock by, once as
        old as the grace (a clock object lives for milliseconds)."""
        ages = Grace(self.storage, grace)
        removed = tensors.sweep(self.storage, young=lambda: ages.young(tensors.AREA))
        if removed != []:
            self.append("sweep", None, tensors.summary(removed))
        left = set(self.storage.modified(CLOCK))
        for name in sorted(left - ages.young(CLOCK) if left else ()):
            self.storage.delete(f"{CLOCK}/{name}")
