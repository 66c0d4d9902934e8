"""What ``gc`` keeps: a policy object rather than a bare number."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """Which versions ``ArtifactStore.gc`` keeps.

    Whatever the policy, gc never removes the current version, the previous
    verified one (the one ``rollback`` returns to), a version still being
    written by a live process (in a bucket, what a put wrote before its
    record until it is ``orphan_grace_s`` old), a version whose record
    cannot be read, or a directory holding files the store did not write.

    Attributes:
      keep_last: how many of the newest finished versions to keep whatever
        their status.
      keep_verified: how many of the newest verified versions to keep
        besides those.
      orphan_grace_s: in a bucket, how many seconds old (by the bucket's
        clock) the objects of a put with no record yet (a sharded put's
        shards, a dedup put's tensors) must be before gc removes them as a
        dead put's: a put still uploading is left alone. 0 removes them at
        once, even a live put's.

    Example:
      >>> RetentionPolicy(keep_last=2).keep_last
      2
      >>> RetentionPolicy(keep_last=-1)
      Traceback (most recent call last):
      ...
      ValueError: keep_last must be 0 or more, got -1
      >>> RetentionPolicy(orphan_grace_s=0).orphan_grace_s
      0
    """

    keep_last: int = 3
    keep_verified: int = 0
    orphan_grace_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_verified"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be 0 or more, got {value!r}")
        grace = self.orphan_grace_s
        if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not grace >= 0:
            raise ValueError(f"orphan_grace_s must be 0 or more seconds, got {grace!r}")
