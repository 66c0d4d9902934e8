"""The ``splits`` check: no example is shared between the train, validation
and test splits (examples compared by hash)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ..diff import mismatches
from .compare import leaves_with_paths
from .context import LISTED, CheckResult, Context, mismatch_lines, outcome


def example_hashes(data: Any, *, where: str = "the data") -> list[str]:
    """The sha256 of each example (index along axis 0 of every leaf), by content.

    Args:
      data: a tree of arrays, examples along axis 0.
      where: how a message names ``data`` (``"split 'val'"``).

    Raises:
      ValueError: if the leaves disagree on the number of examples, naming
        each leaf's path and count.

    Example:
      >>> h = example_hashes({"x": np.arange(6.0).reshape(3, 2)})
      >>> len(h), h[0] == example_hashes({"x": np.arange(2.0)[None]})[0]
      (3, True)
    """
    arrays = [(p, np.asarray(x)) for p, x in leaves_with_paths(data)]
    sizes = {a.shape[0] if a.ndim else None for _, a in arrays}
    if len(sizes) != 1 or None in sizes:
        counts = [
            f"{p or '<root>'} has {a.shape[0] if a.ndim else 'no axis 0 (a scalar)'}"
            for p, a in arrays[:LISTED]
        ]
        more = f", ... and {len(arrays) - LISTED} more" if len(arrays) > LISTED else ""
        raise ValueError(
            f"{where}: leaves disagree on the number of examples: {', '.join(counts)}{more}; "
            "hint: give every leaf the same number of rows along axis 0"
        )
    n = sizes.pop() or 0
    out = []
    for i in range(int(n)):
        h = hashlib.sha256()
        for path, a in arrays:
            row = np.ascontiguousarray(a[i])
            h.update(f"{path}|{row.dtype.name}|{row.shape}|".encode())
            h.update(row.tobytes())
        out.append(h.hexdigest())
    return out


def check_splits(ctx: Context) -> CheckResult:
    """No example appears in two of the model's data splits (by content hash)."""
    data = ctx.model.split_data()
    if data is None:
        return CheckResult("splits", "skip", "the model provides no data splits")
    seen: dict[str, tuple[str, int]] = {}
    bad: list[str] = []
    counts: dict[str, int] = {}
    overlaps = 0
    spec = ctx.model.batch_spec
    for split, tree in data.items():
        where = f"split {split!r}"
        found = mismatches(tree, spec)
        if found:
            bad += mismatch_lines(found, where, "the batch spec", "the split")
            bad.append(
                f"{where} does not match Model.batch_spec, so its examples were not compared; "
                "hint: give it the spec's dtypes and feature shapes, examples along axis 0"
            )
            continue
        try:
            hashes = example_hashes(tree, where=where)
        except ValueError as e:
            bad.append(str(e))
            continue
        counts[split] = len(hashes)
        for i, h in enumerate(hashes):
            prior = seen.get(h)
            if prior is not None and prior[0] != split:
                overlaps += 1
                if overlaps <= LISTED:
                    bad.append(
                        f"example {i} of {split!r} is example {prior[1]} of {prior[0]!r} "
                        f"(sha256 {h[:12]}...)"
                    )
            elif prior is None:
                seen[h] = (split, i)
    if overlaps > LISTED:
        bad.append(f"... and {overlaps - LISTED} more shared examples")
    sizes = ", ".join(f"{k} {v}" for k, v in counts.items())
    failed = f"{overlaps} example(s) appear in two splits ({sizes})"
    if len(counts) < len(data):
        failed = f"{len(data) - len(counts)} split(s) do not match the batch spec"
    return outcome(
        "splits",
        bad,
        f"no example in two splits ({sizes})",
        failed,
        rows=[{"split": k, "examples": v} for k, v in counts.items()],
    )
