"""The device-side watch of ``check="next"``: a flag that sticks at the
first non-finite step, and the params and state held from before it.

Reading a value from an accelerator costs the host about as long as
dispatching a small step (about 0.1 ms on a TPU v5e host), so a loop that
reads nothing else must not read a flag every step. Instead each step's
program carries the *watch*, two int32 on the device: the number of the next
step and the number of the first non-finite step (-1 while there is none),
counted from the watch's first step (the host adds the run's own number).
Once it is set, every later program returns the params and the state it was
given, so whenever the host reads the watch the newest params are those from
before the step that went wrong. The host reads it every ``READ_EVERY``
steps (and at ``flush``), in the background.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import ConfigError

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


def start_watch(step: int) -> jax.Array:
    """A watch for the step numbered ``step``, none of them non-finite yet
    (uncommitted, so that it joins the step's devices).

    Example:
      >>> start_watch(7).tolist()
      [7, -1]
    """
    return jnp.asarray([step, -1], dtype=jnp.int32)


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
    watch: jax.Array, before: tuple[Any, ...], after: tuple[Any, ...], *, what: tuple[str, ...]
) -> tuple[Any, ...]:
    """``after``, or ``before`` once the watch has a non-finite step (traced;
    each pair of trees of one structure, shapes and dtypes, named by ``what``).

    A conditional rather than a select: while the steps are finite the program
    hands its new values out as they are, with no pass over them (a select
    would read and write every leaf once more); a copy of ``before`` is made
    only once a step has gone wrong.

    Raises:
      ConfigError: naming the tree and the first leaf that differs, when the
        step's output does not match its input.

    Example:
      >>> hold(start_watch(0), ({"w": jnp.ones(2)},), ({"w": jnp.zeros(2)},), what=("the params",))
      ({'w': Array([0., 0.], dtype=float32)},)
    """
    matched = [_matched(b, a, w) for b, a, w in zip(before, after, what, strict=True)]
    given = [leaf for m in matched for leaf in m[0]]
    new = [jnp.asarray(leaf) for m in matched for leaf in m[1]]
    out = lax.cond(watch[FIRST_BAD] >= 0, lambda: given, lambda: new)
    held, at = [], 0
    for _, leaves, treedef in matched:
        held.append(jax.tree.unflatten(treedef, out[at : at + len(leaves)]))
        at += len(leaves)
    return tuple(held)
