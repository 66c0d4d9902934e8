"""What ``gc`` keeps: a policy object rather than a bare number."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """Which versions ``ArtifactStore.gc`` keeps.

    Whatever the policy, gc never removes the current version, the previous
    verified one (the one ``rollback`` returns to), a version still being
    written by a live process, a version whose record cannot be read, or a
    directory holding files the store did not write.

    Attributes:
      keep_last: how many of the newest finished versions to keep whatever
        their status.
      keep_verified: how many of the newest verified versions to keep
        besides those.

    Example:
      >>> RetentionPolicy(keep_last=2).keep_last
      2
      >>> RetentionPolicy(keep_last=-1)
      Traceback (most recent call last):
      ...
      ValueError: keep_last must be 0 or more, got -1
    """

    keep_last: int = 3
    keep_verified: int = 0

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_verified"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be 0 or more, got {value!r}")
