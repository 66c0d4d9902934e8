"""The host's side of ``check="next"``: the steps whose flag is not read yet,
their mark read every ``READ_EVERY`` steps in the background, and the step
that went wrong found among them.

After each call the recorder hands over the step's mark (``sticky``) and the
params and state the program returned. Every ``READ_EVERY`` steps the newest
mark's copy to the host begins, and it is read at the following call, by
when it has arrived, so the device's queue never drains. A finite mark lets
go of the steps up to it; a mark that shows a non-finite step names it (the
watch holds its number; with carried losses it is the first of the kept
marks that is NaN), and the recorder replays it from the held params.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple

import jax
import numpy as np

from ..errors import ConfigError
from .sticky import FIRST_BAD, READ_EVERY

_DELETED = (
    'the loss a step returned was deleted or donated: with check="next" it carries the '
    "flag into the steps after it, until the flag is read"
)
_DELETED_HINT = 'keep the returned loss alive (donate jnp.copy(loss) instead), or use check="now"'


def _alive(mark: jax.Array) -> jax.Array:
    """``mark``, refused where the caller deleted or donated it.

    Raises:
      ConfigError: for a deleted mark.
    """
    if mark.is_deleted():
        raise ConfigError(_DELETED, hint=_DELETED_HINT)
    return mark


class Unread(NamedTuple):
    """A step whose flag is not read yet: what replaying it needs beside the
    held params and state, and the mark its program returned (a carried loss
    is read to find the step that went wrong; a watch names it itself)."""

    number: int
    batch: Any
    key: Any
    mark: Any


class Refused(NamedTuple):
    """The first non-finite step of those read, and the params and state the
    programs held from before it."""

    step: Unread
    params: Any
    opt_state: Any


class Pending:
    """The steps of a ``check="next"`` run whose flag is not read yet.

    Attributes:
      mark: the mark the next step's program takes (None before the first
        step, and after a refusal).
    """

    def __init__(self) -> None:
        self.mark: jax.Array | None = None
        #: the number of the watch's first step: the watch counts from 0, so
        #: that an int32 holds any step number (a resumed run's past 2**31)
        self._base = 0
        self._unread: deque[Unread] = deque()
        #: the number of the step whose mark is being copied to the host, and that mark
        self._probe: tuple[int, jax.Array] | None = None
        #: the newest params and state: from before a non-finite step, once it sticks
        self._held: tuple[Any, Any] = (None, None)

    def next_mark(self) -> jax.Array | None:
        """The mark the next step's program takes (None before a run's first step).

        Raises:
          ConfigError: where the caller deleted or donated it (a carried loss
            is the loss a call returned).
        """
        return None if self.mark is None else _alive(self.mark)

    def start(self, mark: jax.Array, number: int) -> None:
        """Starts a run of marks at step ``number`` with the first mark."""
        self.mark, self._base = mark, number

    def dispatched(self, step: Unread, held: tuple[Any, Any]) -> Refused | None:
        """Takes a dispatched step, with its mark (the next step's input; kept
        with the step where it is a carried loss), and the params and state its
        program returned. Reads the mark whose copy began a step ago, and begins
        a copy every ``READ_EVERY`` steps.

        Returns:
          The refused step, when the mark read shows one.
        """
        mark = self.mark = step.mark
        self._held = held
        self._unread.append(step)
        probe, self._probe = self._probe, None
        refused = self._read(*probe) if probe is not None else None
        if refused is None and len(self._unread) >= READ_EVERY:
            mark.copy_to_host_async()
            self._probe = (step.number, mark)
        return refused

    def flush(self) -> Refused | None:
        """Reads the newest mark: every step is read afterwards.

        Returns:
          The refused step, when the mark shows one.
        """
        self._probe = None
        refused = None
        if self.mark is not None and self._unread:
            refused = self._read(self._unread[-1].number, self.mark)
        self._held = (None, None)  # every step is read: nothing is replayed from them
        return refused

    def _read(self, through: int, mark: jax.Array) -> Refused | None:
        """Takes the mark of step ``through`` on the host: the steps up to it are
        finite, or the first that is not is refused (and those after it dropped)."""
        value = np.asarray(_alive(mark))
        if mark.ndim == 0:
            bad = self._first_marked() if math.isnan(float(value)) else -1
        else:
            bad = self._base + int(value[FIRST_BAD]) if value[FIRST_BAD] >= 0 else -1
        while self._unread and self._unread[0].number < (through + 1 if bad < 0 else bad):
            self._unread.popleft()
        if bad < 0:
            return None
        refused = Refused(self._unread.popleft(), *self._held)
        self._unread.clear()
        self.mark = self._probe = None
        self._held = (None, None)
        return refused

    def _first_marked(self) -> int:
        """The number of the first kept step whose carried loss is NaN (the
        marks stick, so it is the step that went wrong)."""
        return next(u.number for u in self._unread if math.isnan(float(_alive(u.mark))))
