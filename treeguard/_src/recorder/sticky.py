"""The device-side mark of ``check="next"``: a flag that sticks at the
first non-finite step, and the params and state held from before it.

Reading a value from an accelerator costs the host about as long as
dispatching a small step (about 0.1 ms on a TPU v5e host), and so does each
output buffer a program makes (about 10 us there), so a loop that reads
nothing else must neither read a flag every step nor grow the step's
outputs. Each step's program takes the *mark* the step before it returned
and returns the next one; once a step is not finite, every later program
returns the params and the state it was given, so whenever the host looks
the newest params are those from before the step that went wrong. The host
reads the mark every ``READ_EVERY`` steps (and at ``flush``), in the
background.

The mark is one of two:

* the step's *carried loss* (``start_carrier``), where the step returns a
  floating scalar loss that can hold NaN: the loss itself, NaN from the
  first non-finite step on. It is an output the step makes anyway, so the
  program makes no buffer more than the bare step; the host finds the first
  step that went wrong among the marks of the steps it has not read yet;
* otherwise the *watch* (``start_watch``), two int32: the number of the next
  step and that of the first non-finite one (-1 while there is none),
  counted from the watch's first step (the host adds the run's own number).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import ConfigError
from .finite import carries

#: How many steps apart ``check="next"`` reads the watch (its copy to the
#: host starts then and is read at the following step).
READ_EVERY = 16

#: The watch's two slots.
COUNT, FIRST_BAD = 0, 1

_HOLD_HINT = (
    'check="next" returns the params and the state from before a non-finite step, so the '
    'step must return them with the shapes and dtypes it was given; use check="now" for a '
    "step that changes them"
)


def first_mark(trees: Any, dtype: Any) -> jax.Array:
    """A run's first mark: a carried loss of ``dtype``, or the watch where
    ``dtype`` is None; made by a program over the device arrays of ``trees``
    (the step's params and state; host arrays are left out, so nothing is
    moved), so that it lies where the step's program puts the marks it
    returns, and the second step compiles nothing (an uncommitted first mark
    beside committed params would make a program of its own).

    Example:
      >>> first_mark({"w": jnp.ones(2)}, None).tolist(), float(first_mark(None, jnp.float32))
      ([0, -1], 1.0)
    """
    placed = [x for x in jax.tree.leaves(trees) if isinstance(x, jax.Array)]  # none moved
    mark: jax.Array = _first_mark(placed, None if dtype is None else jnp.dtype(dtype))
    return mark


@functools.partial(jax.jit, static_argnums=1, keep_unused=True)
def _first_mark(trees: Any, dtype: Any) -> jax.Array:
    return start_watch(0) if dtype is None else start_carrier(dtype)


def start_watch(step: int) -> jax.Array:
    """A watch for the step numbered ``step``, none of them non-finite yet.

    Example:
      >>> start_watch(7).tolist()
      [7, -1]
    """
    return jnp.asarray([step, -1], dtype=jnp.int32)


def start_carrier(dtype: Any) -> jax.Array:
    """A carried loss for the first step: a finite scalar of the loss's dtype
    (one: ``float8_e8m0fnu`` has no zero, its zero is NaN).

    Example:
      >>> float(start_carrier(jnp.bfloat16))
      1.0
    """
    return jnp.ones((), dtype)


def moved(mark: jax.Array, ok: jax.Array, loss: Any) -> tuple[jax.Array, jax.Array]:
    """Whether this step or one before it was not finite, and the mark to hand
    on, traced: a carried loss (a scalar mark) becomes ``loss``, or NaN from the
    first non-finite step on; a watch advances.

    Example:
      >>> bad, mark = moved(start_carrier(jnp.float32), jnp.bool_(True), jnp.float32(2.5))
      >>> bool(bad), float(mark)
      (False, 2.5)
      >>> bad, mark = moved(jnp.float32(jnp.nan), jnp.bool_(True), jnp.float32(2.5))
      >>> bool(bad), float(mark)
      (True, nan)
      >>> bad, watch = moved(start_watch(0), jnp.bool_(False), None)
      >>> bool(bad), watch.tolist()
      (True, [1, 0])
    """
    if mark.ndim == 0:
        _same_carrier(mark, loss)
        bad = jnp.isnan(mark) | jnp.logical_not(ok)
        return bad, jnp.where(bad, jnp.full_like(loss, jnp.nan), loss)
    watch = advance(mark, ok)
    return watch[FIRST_BAD] >= 0, watch


def _same_carrier(mark: jax.Array, loss: Any) -> None:
    """Refuses a loss that cannot carry on the run's mark (traced).

    Raises:
      ConfigError: for a loss that is no longer a strongly typed floating
        scalar of the first step's loss's dtype.
    """
    if (
        loss is not None
        and carries(loss)
        and jnp.result_type(loss) == mark.dtype
        and not getattr(jax.typeof(loss), "weak_type", False)
    ):
        return
    shown = (
        f"{jnp.result_type(loss)}{list(jnp.shape(loss))}"
        if loss is not None and hasattr(loss, "dtype")
        else type(loss).__name__
    )
    raise ConfigError(
        f"the step returned its loss as {shown}, and the run's first step as a "
        f'{mark.dtype} scalar: with check="next" that loss carries the flag from one '
        "step to the next",
        hint='keep the loss one strongly typed scalar dtype for the whole run, or use check="now"',
    )


def advance(watch: jax.Array, ok: jax.Array) -> jax.Array:
    """The watch after a step whose finiteness flag is ``ok``, traced: the
    count moves on; the first non-finite step is kept, or set to this one.

    Example:
      >>> advance(advance(start_watch(3), jnp.bool_(False)), jnp.bool_(False)).tolist()
      [5, 3]
    """
    count, bad = watch[COUNT], watch[FIRST_BAD]
    bad = jnp.where((bad < 0) & jnp.logical_not(ok), count, bad)
    return jnp.stack([count + 1, bad])


def _matched(before: Any, after: Any, what: str) -> tuple[list[jax.Array], list[Any], Any]:
    """The leaves of ``before`` and ``after``, and ``after``'s structure.

    Raises:
      ConfigError: naming ``what`` and the first leaf that differs.
    """
    before_leaves, before_def = jax.tree_util.tree_flatten_with_path(before)
    after_leaves, after_def = jax.tree.flatten(after)
    if before_def != after_def:  # type: ignore[operator]
        raise ConfigError(
            f"the step returned {what} of another structure than it was given", hint=_HOLD_HINT
        )
    given = []
    for (path, leaf), a in zip(before_leaves, after_leaves, strict=True):
        b = jnp.asarray(leaf)
        if b.shape != jnp.shape(a) or b.dtype != jnp.result_type(a):
            raise ConfigError(
                f"the step returned {what}{jax.tree_util.keystr(path)} as "
                f"{jnp.result_type(a)}{list(jnp.shape(a))}, given {b.dtype}{list(b.shape)}",
                hint=_HOLD_HINT,
            )
        given.append(b)
    return given, after_leaves, after_def


def hold(
    bad: jax.Array, before: tuple[Any, ...], after: tuple[Any, ...], *, what: tuple[str, ...]
) -> tuple[Any, ...]:
    """``after``, or ``before`` once ``bad`` (``moved``) says a step was not
    finite (traced; each pair of trees of one structure, shapes and dtypes,
    named by ``what``).

    A conditional rather than a select: while the steps are finite the program
    hands its new values out as they are, with no pass over them (a select
    would read and write every leaf once more); a copy of ``before`` is made
    only once a step has gone wrong.

    Raises:
      ConfigError: naming the tree and the first leaf that differs, when the
        step's output does not match its input.

    Example:
      >>> before, after = ({"w": jnp.ones(2)},), ({"w": jnp.zeros(2)},)
      >>> hold(jnp.bool_(False), before, after, what=("the params",))
      ({'w': Array([0., 0.], dtype=float32)},)
    """
    matched = [_matched(b, a, w) for b, a, w in zip(before, after, what, strict=True)]
    given = [leaf for m in matched for leaf in m[0]]
    new = [jnp.asarray(leaf) for m in matched for leaf in m[1]]
    out = lax.cond(bad, lambda: given, lambda: new)
    held, at = [], 0
    for _, leaves, treedef in matched:
        held.append(jax.tree.unflatten(treedef, out[at : at + len(leaves)]))
        at += len(leaves)
    return tuple(held)
