"""``Surgery``: the report of what a load or an optimizer-state migration
changed, path by path.

A model that gained a head or lost a layer is loaded with its new leaves
initialised and its stale ones dropped; an optimizer state is carried over
to the new params. Each of these returns a ``Surgery`` next to the tree, so
that nothing changes without a record: the report prints as one line per
path and goes into the metadata of a checkpoint saved from the result
(``save(..., surgery=report)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal

from .errors import cap_lines
from .leaf import dtype_of, summarize

Action = Literal["initialised", "dropped", "renamed", "reinitialised"]
_ACTIONS: tuple[Action, ...] = ("initialised", "renamed", "reinitialised", "dropped")
#: The metadata key a saved checkpoint keeps its surgery report under.
METADATA_KEY = "treeguard.surgery"


@dataclasses.dataclass(frozen=True)
class Change:
    """One path a load or a migration changed.

    Attributes:
      action: ``"initialised"`` (a new leaf, given its initial value),
        ``"dropped"`` (a stored leaf left unused), ``"renamed"`` (a stored
        leaf read under a new path) or ``"reinitialised"`` (a leaf whose
        shape changed, given a fresh value on purpose).
      path: the key path in the result (for ``"dropped"``, in the source).
      shape: the leaf's shape.
      dtype: the leaf's dtype name.
      source: for ``"renamed"``, the path it was stored under.
    """

    action: Action
    path: str
    shape: tuple[int, ...]
    dtype: str
    source: str | None = None

    def line(self) -> str:
        """``initialised ['head']['w'] f32[32,10]``."""
        what = summarize(self.shape, dtype_of(self.dtype))
        text = f"{self.action} {self.path or '<root>'} {what}"
        return text + (f" (from {self.source})" if self.source is not None else "")


class _PathsOf:
    """Read on a ``Surgery``: the paths of its changes of one action."""

    def __init__(self, action: Action) -> None:
        self.action = action

    def __get__(
        self, report: Surgery | None, owner: type[Surgery] | None = None
    ) -> tuple[str, ...]:
        if report is None:  # read on the class: there is no report to read
            raise AttributeError(self.action)
        return tuple(c.path for c in report.changes if c.action == self.action)


@dataclasses.dataclass(frozen=True)
class Surgery:
    """What a load with ``missing="init"``, ``unexpected="drop"`` or
    ``rename=``, or ``migrate_opt_state``, changed, path by path.

    Attributes:
      changes: every change, initialised first, then renamed, reinitialised
        and dropped, each group sorted by path.
      source: what was changed (a checkpoint's path, ``"optimizer state"``).
      initialised: the paths given an initial value.
      dropped: the stored paths left unused.
      renamed: the new paths of renamed leaves.
      reinitialised: the paths whose shape changed and were given a fresh value.

    Example:
      >>> s = Surgery((Change("initialised", "['head']['w']", (4, 2), "float32"),), "ckpt")
      >>> print(s)
      ckpt: 1 change
        initialised ['head']['w'] f32[4,2]
      >>> s.initialised
      ("['head']['w']",)
    """

    changes: tuple[Change, ...]
    source: str

    @staticmethod
    def of(changes: Iterable[Change], source: str) -> Surgery:
        """A report with its changes in report order."""
        order = {a: i for i, a in enumerate(_ACTIONS)}
        ordered = sorted(changes, key=lambda c: (order[c.action], c.path))
        return Surgery(tuple(ordered), source)

    initialised = _PathsOf("initialised")
    dropped = _PathsOf("dropped")
    renamed = _PathsOf("renamed")
    reinitialised = _PathsOf("reinitialised")

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __str__(self) -> str:
        n = len(self.changes)
        if not n:
            return f"{self.source}: no change"
        head = f"{self.source}: {n} change{'s' if n != 1 else ''}"
        return "\n".join([head, *cap_lines([f"  {c.line()}" for c in self.changes])])

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (what a saved checkpoint's metadata keeps)."""
        return {
            "source": self.source,
            "changes": [
                {
                    "action": c.action,
                    "path": c.path,
                    "shape": list(c.shape),
                    "dtype": c.dtype,
                    **({"source": c.source} if c.source is not None else {}),
                }
                for c in self.changes
            ],
        }
