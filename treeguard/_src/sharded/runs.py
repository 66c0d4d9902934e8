"""A saved shard read straight into the target shards it overlaps: whether
their parts tile it, and its bytes in C order as runs of those parts, the
bytes its digest is taken over (``reader``).

A reshard's target shard takes pieces of several saved shards, and a saved
shard gives pieces to several target shards. Reading each saved shard into
a buffer of its own and copying its pieces on costs a copy of every byte;
reading it through a view of each target part it fills does not. Its
digest is then taken over those same views, in the saved shard's C order:
for each index of its leading axes, the contiguous run each part holds of
the trailing ones, in order. The bytes hashed are the bytes returned.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .digests import Index

Cells = list[list[tuple[int, int]]]
#: A saved shard is read straight into its target parts only when hashing
#: it takes at most ``MAX_RUNS`` calls, or its runs average ``RUN_BYTES``
#: or more: each run is one call into the hasher, and a shard split into
#: many tiny runs costs less to copy once and hash whole.
MAX_RUNS = 4096
RUN_BYTES = 4096


def grid(shard: Index, regions: Sequence[Index]) -> Cells | None:
    """The cells of each axis when ``regions`` tile ``shard`` as a grid,
    one region to a cell and every cell a region; None otherwise (a part
    of the shard no target shard of this process holds, or overlaps).

    Example:
      >>> grid(((0, 4), (0, 2)), [((0, 2), (0, 2)), ((2, 4), (0, 2))])
      [[(0, 2), (2, 4)], [(0, 2)]]
      >>> grid(((0, 4), (0, 2)), [((0, 2), (0, 2))]) is None
      True
    """
    cells = [sorted({r[k] for r in regions}) for k in range(len(shard))]
    for axis, (lo, hi) in zip(cells, shard):
        if not axis or axis[0][0] != lo or axis[-1][1] != hi:
            return None
        if any(a[1] != b[0] for a, b in itertools.pairwise(axis)):
            return None
    if len(set(regions)) != len(regions) or len(regions) != math.prod(len(c) for c in cells):
        return None
    return cells


def _cell(region: Index, cells: Cells) -> tuple[int, ...]:
    return tuple(axis.index(extent) for axis, extent in zip(cells, region))


def _tail(cells: Cells, views: Sequence[np.ndarray[Any, Any]]) -> int:
    """How many trailing axes one run spans: the most whose axes after the
    first are whole in the shard and whose bytes are contiguous in every part."""
    d, t = len(cells), 1
    while t < d and len(cells[d - t]) == 1:
        lead = (0,) * (d - t - 1)
        if not all(v[lead].flags.c_contiguous for v in views):
            break
        t += 1
    return t


class Runs:
    """The bytes of one saved shard, in C order, as runs of the target parts
    it was read into; iterating gives each run as a flat ``uint8`` array.

    Args:
      shard: the saved shard's index.
      regions: the region of the shard each part holds (``grid`` of them
        must not be None).
      views: each part, a view of its target shard's buffer, of its
        region's shape; the last axis contiguous.

    Example:
      >>> a, b = np.arange(8, dtype=np.uint8).reshape(2, 4), np.zeros((2, 4), np.uint8)
      >>> runs = Runs(((0, 2), (0, 4)), [((0, 2), (0, 2)), ((0, 2), (2, 4))], [a[:, :2], a[:, 2:]])
      >>> len(runs), b"".join(bytes(r) for r in runs) == a.tobytes()
      (4, True)
    """

    def __init__(
        self, shard: Index, regions: Sequence[Index], views: Sequence[np.ndarray[Any, Any]]
    ) -> None:
        cells = grid(shard, regions)
        if cells is None:
            raise ValueError(f"the regions {list(regions)} do not tile the shard {shard}")
        d = self._d = len(shard)
        self._tail = _tail(cells, views) if d else 0
        lead = d - self._tail
        self._split = len(cells[lead]) if d else 1
        self._cells = cells[:lead]
        self._rows = math.prod(hi - lo for lo, hi in shard[:lead])
        self._parts: dict[tuple[int, ...], np.ndarray[Any, Any]] = {}
        for region, view in zip(regions, views):
            # a view, not a copy: ``_tail`` joins only axes contiguous in every part
            flat = view.reshape((*view.shape[:lead], -1))
            self._parts[_cell(region, cells)] = flat.view(np.uint8)

    def __len__(self) -> int:
        return self._rows * self._split

    @property
    def nbytes(self) -> int:
        """The bytes of the shard."""
        return sum(int(p.nbytes) for p in self._parts.values())

    def __iter__(self) -> Iterator[np.ndarray[Any, Any]]:
        rest = (0,) * max(self._tail - 1, 0)
        if not self._cells:  # one run per part
            for c in range(self._split):
                yield self._parts[(c, *rest)[: self._d]]
            return
        # the leading axes but the last, index by index in C order: (cell, index in it)
        outer = [
            [(c, i) for c, (lo, hi) in enumerate(a) for i in range(hi - lo)]
            for a in self._cells[:-1]
        ]
        for combo in itertools.product(*outer):
            block, at = tuple(c for c, _ in combo), tuple(i for _, i in combo)
            for last in range(len(self._cells[-1])):
                row = [self._parts[(*block, last, c, *rest)][at] for c in range(self._split)]
                if len(row) == 1:
                    yield from row[0]  # its rows, each a run
                    continue
                for i in range(row[0].shape[0]):
                    for part in row:
                        yield part[i]


def fits(runs: Runs) -> bool:
    """Whether hashing ``runs`` one at a time is cheap enough (``MAX_RUNS``)."""
    return len(runs) <= MAX_RUNS or runs.nbytes >= RUN_BYTES * len(runs)
