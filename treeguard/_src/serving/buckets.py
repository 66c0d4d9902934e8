"""Batch buckets: which compiled size a batch runs at, and padding to it.

Every batch runs at one of a few sizes compiled at warm-up, so no request
size ever starts a compile. A batch of ``n`` rows goes to the smallest bucket
that holds it and is padded with zero rows; the padded rows are sliced off
before any output leaves the server.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from .spec import Overflow

#: Why a row count cannot be served.
REASONS = ("empty", "over_max_rows", "over_largest_bucket")


@dataclasses.dataclass(frozen=True)
class Admission:
    """How a request of ``rows`` rows is served.

    Attributes:
      rows: the request's row count.
      chunks: the row counts of the batches it runs as (one, unless split);
        empty when refused.
      reason: why it is refused (one of ``REASONS``), else None.
      detail: the refusal in words, naming the limit.
    """

    rows: int
    chunks: tuple[int, ...]
    reason: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None


def bucket_for(rows: int, buckets: Sequence[int], /) -> int | None:
    """The smallest bucket that holds ``rows`` rows, or None if none does.

    Example:
      >>> bucket_for(3, (1, 2, 4, 8)), bucket_for(8, (1, 2, 4, 8)), bucket_for(9, (1, 2, 4, 8))
      (4, 8, None)
    """
    if rows < 1:
        return None
    i = bisect.bisect_left(buckets, rows)
    return buckets[i] if i < len(buckets) else None


def admit(rows: int, buckets: Sequence[int], /, *, max_rows: int, overflow: Overflow) -> Admission:
    """Decides whether and how a request of ``rows`` rows is served.

    Args:
      rows: the request's row count.
      buckets: the increasing bucket sizes.
      max_rows: the most rows a request may hold.
      overflow: what to do over the largest bucket.

    Returns:
      The ``Admission``: its ``chunks`` each fit the largest bucket and sum
      to ``rows``, or its ``reason`` says why the request is refused.

    Example:
      >>> admit(100, (1, 2, 4, 64), max_rows=256, overflow=Overflow.SPLIT).chunks
      (64, 36)
      >>> admit(100, (1, 2, 4, 64), max_rows=256, overflow=Overflow.REJECT).reason
      'over_largest_bucket'
    """
    largest = buckets[-1]
    if rows < 1:
        return Admission(rows, (), "empty", "the request has 0 rows; hint: send at least one")
    if rows > max_rows:
        return Admission(
            rows,
            (),
            "over_max_rows",
            f"the request has {rows} rows, over the limit of {max_rows}; "
            "hint: send fewer rows per request",
        )
    if rows <= largest:
        return Admission(rows, (rows,))
    if overflow is Overflow.REJECT:
        return Admission(
            rows,
            (),
            "over_largest_bucket",
            f"the request has {rows} rows, over the largest batch bucket {largest}; "
            f"hint: send at most {largest} rows per request",
        )
    full, rest = divmod(rows, largest)
    return Admission(rows, (largest,) * full + ((rest,) if rest else ()))


def pad_rows(x: np.ndarray[Any, Any], bucket: int, /) -> np.ndarray[Any, Any]:
    """``x`` with zero rows appended along axis 0 up to ``bucket`` rows.

    Example:
      >>> pad_rows(np.ones((3, 2), np.float32), 4).tolist()
      [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    """
    n = x.shape[0]
    if n == bucket:
        return x
    if n > bucket:
        raise ValueError(f"{n} rows do not fit the bucket {bucket}")
    out = np.zeros((bucket, *x.shape[1:]), x.dtype)
    out[:n] = x
    return out
