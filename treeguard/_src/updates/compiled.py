"""The compiled step every checked update holds: one ``jax.jit`` function per
signature, validation while tracing, and the traced tail that guards against
NaN and Inf.

A checked step (``updater``, ``apply_updates``, ``optax_step``) hands its
trees straight to one ``jax.jit`` function, whose C++ dispatch finds the
compiled step for the call's signature (treedefs, shapes, dtypes, weak
types) as fast as a raw jitted ``tree.map``. Validation runs when a new
signature is traced: structure, shapes and dtypes of every tree against the
params, and the step's own results (a promoted or broadcast result, a
drifting optimizer state). It raises before anything is computed, so a
repeated call pays nothing for it.

Two checks need the host. Every tree is walked for cycles before JAX sees it
(JAX's flatten does not survive a cycle). With several devices, each call
also reads the leaves' shardings: a new combination of shardings gets its own
compiled step, pinned to the params' shardings. Errors JAX raises about the
arguments themselves (a leaf that is no array, a leaked tracer, a donated
buffer, a layout it refuses) are diagnosed on the host and re-raised naming
the key path.

``CompiledStep`` is what ``Updater`` and ``OptaxStep`` hold: they give it a
``body`` (a function of the shardings to pin and a cast recorder that returns
the traced step) and call what ``function`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from ..bounded import Bounded
from ..errors import InvalidTreeError, NonFiniteError, TreeguardError
from ..leaf import summarize
from ..nonfinite import all_finite, describe_counts, find_nonfinite
from .layout import LabelledTree, check_arrays, check_scalars, is_tracer, labelled_trees
from .policy import Cast, OnNonfinite
from .shardings import (
    from_jax,
    multi_device,
    plan_shardings,
    plan_shardings_all,
    refuse_foreign,
    refused_layout,
    sharded_leaves,
    sharding_of,
    sharding_refused,
)

#: How many distinct sharding combinations one step keeps compiled.
MAX_SHARDINGS = 32

#: The shardings to pin, one list (or None) per pinned group, or None.
Shardings: TypeAlias = Sequence[list[Any] | None] | None
#: Records the casts a trace did.
Recorder: TypeAlias = Callable[[Sequence[Cast]], None]
#: Builds the traced step for the given shardings.
Body: TypeAlias = Callable[[Shardings, Recorder], Callable[..., Any]]


class CompiledStep:
    """A traced step compiled once per signature, with its counters.

    Args:
      body: ``body(shardings, record)`` returns the function to trace; it
        pins its results to ``shardings`` and reports its casts to ``record``.
      donated: the argument positions donated when ``donate`` is true.
      donate: whether to donate them.
      pinned: ``(tree, trees matched against it)`` pairs, by argument
        position: each group's results are pinned to the first tree's
        shardings, and the matched trees must live on its devices.
    """

    def __init__(
        self,
        body: Body,
        *,
        donated: tuple[int, ...],
        donate: bool,
        pinned: Sequence[tuple[int, Sequence[int]]] = ((0, (1,)),),
    ) -> None:
        self._body = body
        self._donated = donated if donate else ()
        self._pinned = tuple(pinned)
        self._jit: Callable[..., Any] | None = None
        self._by_sharding: Bounded[Any, Callable[..., Any]] = Bounded(MAX_SHARDINGS)
        self._multi: bool | None = None
        self._traces = 0
        self._skipped: Any = None
        self._casts: dict[tuple[str, str, str, str], Cast] = {}

    def __getstate__(self) -> dict[str, Any]:
        # a copy compiles its own program, as ``_by_sharding`` starts empty: the
        # one kept counts into this step and records its casts here, and does not pickle
        return {**self.__dict__, "_jit": None}

    @property
    def compile_count(self) -> int:
        """How many times the step has been traced."""
        return self._traces

    @property
    def skipped(self) -> int:
        """How many steps were skipped; reading it waits for the device."""
        return 0 if self._skipped is None else int(self._skipped)

    @property
    def casts(self) -> tuple[Cast, ...]:
        """Every distinct cast recorded, in the order first seen."""
        return tuple(self._casts.values())

    def _record(self, casts: Sequence[Cast]) -> None:
        for c in casts:
            self._casts.setdefault((c.path, c.source, c.target, c.where), c)

    def function(
        self, labelled: Callable[[], Sequence[tuple[str, Any]]], trees: Sequence[Any]
    ) -> Callable[..., Any]:
        """The jitted step for this call: one for all signatures on a single
        device; one per combination of shardings with several devices."""
        if self._multi is None:
            self._multi = multi_device()
        if not self._multi:
            if self._jit is None:
                self._jit = self._make(None)
            return self._jit
        key = tuple(tuple(map(sharding_of, jax.tree.leaves(t))) for t in trees)
        fn = self._by_sharding.get(key)
        if fn is None:
            shardings = plan_shardings_all(labelled_trees(labelled()), self._pinned)
            fn = self._make(shardings)
            self._by_sharding.put(key, fn)
        return fn

    def _make(self, shardings: Shardings) -> Callable[..., Any]:
        traced = self._body(shardings, self._record)

        def counted(*args: Any) -> Any:
            out = traced(*args)
            self._traces += 1
            return out

        return jax.jit(counted, donate_argnums=self._donated)

    def skip_in(self) -> Any:
        """The skip count to pass into a step with ``on_nonfinite="skip"``."""
        if self._skipped is None:
            self._skipped = jnp.zeros((), jnp.int32)
        return self._skipped

    def skip_out(self, new: Any) -> None:
        """Keeps the skip count a step returned (not one traced by an outer jit)."""
        if not is_tracer(new):
            self._skipped = new


def finish_step(
    new: list[Any],
    old: list[Any],
    on_nonfinite: OnNonfinite,
    donate: bool,
    skipped: Any,
) -> tuple[list[Any], Any]:
    """Traced tail of a step: checks ``new`` for NaN/Inf and keeps ``old``
    when the step must not be applied.

    The check is one fused reduction over all leaves of a dtype (a per-leaf
    reduction compiles far slower on trees of thousands of leaves); which
    leaves hold what is worked out on the host, on the error path only.

    Returns:
      The leaves to return and the extra output: ``()`` for ``"ignore"``,
      the new skip count for ``"skip"``, the all-finite flag for ``"raise"``.
    """
    if on_nonfinite == "ignore":
        return new, ()
    ok = all_finite(new)
    if on_nonfinite == "skip" or donate:
        new = jax.lax.cond(ok, lambda a, b: list(a), lambda a, b: list(b), new, old)
    if on_nonfinite == "skip":
        return new, skipped + jnp.logical_not(ok).astype(jnp.int32)
    return new, ok


def nonfinite_sections(checked: Sequence[LabelledTree]) -> tuple[list[str], list[dict[str, int]]]:
    """The lines naming the leaves that hold NaN or Inf in each tree of
    ``checked`` (one section per tree that holds any), and each tree's
    ``{path: count}``; run on the error path only."""
    sections: list[str] = []
    found_all: list[dict[str, int]] = []
    for lay in checked:
        found = find_nonfinite(lay.tree)
        found_all.append(found)
        if found:
            text = describe_counts(found, lay.leaves, lay.paths(), where=lay.label, hint="")
            sections.append(text.removesuffix("\nhint: "))
    if not sections:
        sections.append("the step produced NaN or Inf from finite inputs")
    return sections, found_all


def nonfinite_error(
    checked: Sequence[LabelledTree],
    *,
    params: Any,
    state: Any = None,
    donate: bool,
) -> NonFiniteError:
    """Builds the error for a refused step, naming the leaves that hold NaN
    or Inf in each tree of ``checked`` (the step's results, or with donated
    buffers, where the results are gone, its inputs).

    Args:
      checked: the trees to search, labelled.
      params: the params from before the step (what the caller keeps).
      state: the optimizer state from before the step, if any.
      donate: whether the caller's buffers were donated.
    """
    sections, found_all = nonfinite_sections(checked)
    kept = "the error's .params hold" if donate else "your params hold"
    text = "\n".join(sections)
    text += (
        f"\nhint: the step was not applied ({kept} the values from before it); find the "
        'source with treeguard.find_nonfinite(grads), or pass on_nonfinite="skip" to skip '
        "such steps"
    )
    return NonFiniteError(
        text,
        counts=found_all[0],
        state_counts=found_all[1] if len(found_all) > 1 else {},
        params=params,
        state=state,
    )


def _deleted_or_leaked(error: Exception, lays: Sequence[LabelledTree]) -> tuple[list[Any], str]:
    problems: list[tuple[str, str]] = []
    hint = "with donate=True, pass the params the previous step returned, not the old ones"
    for lay in lays:
        for x, path in zip(lay.leaves, lay.paths()):
            if not is_tracer(x) and getattr(x, "is_deleted", lambda: False)():
                what = summarize(tuple(x.shape), np.dtype(x.dtype))
                problems.append(
                    (
                        path,
                        f"{what} was deleted, probably donated to an earlier step (in {lay.label})",
                    )
                )
    if not problems and isinstance(error, jax.errors.UnexpectedTracerError):
        hint = "return values out of jit/vmap/grad instead of storing them from inside"
        for lay in lays:
            for x, path in zip(lay.leaves, lay.paths()):
                if is_tracer(x):
                    what = summarize(tuple(x.shape), np.dtype(x.dtype))
                    problems.append(
                        (
                            path,
                            f"{what} is a tracer that leaked out of a finished "
                            f"transformation (in {lay.label})",
                        )
                    )
    return problems, hint


def explain_step_error(
    error: Exception, layouts: Callable[[], Sequence[LabelledTree]], hyper: dict[str, Any]
) -> None:
    """Turns JAX's complaint about a step's arguments into an error that names
    the key path; returns (so the caller re-raises) when it finds nothing."""
    if isinstance(error, TreeguardError):
        return
    lays = layouts()
    try:
        check_arrays(lays)
        check_scalars(hyper)
    except TreeguardError as e:
        raise e from error
    problems, hint = _deleted_or_leaked(error, lays)
    if problems:
        raise InvalidTreeError(problems, hint=hint) from error
    if isinstance(error, ValueError) and "devices" in str(error):
        plan_shardings(lays[0], [lay for lay in lays[1:] if lay.treedef == lays[0].treedef])
    if refused_layout(error):
        refuse_foreign(lays[0], lays[1:], [sharding_of(x) for x in lays[0].leaves])
        sharded = sharded_leaves(lays)
        if sharded:
            raise sharding_refused(error, sharded) from error


def _name_refused_leaves(
    error: InvalidTreeError, cause: BaseException, lays: Sequence[LabelledTree]
) -> None:
    """Raises a layout refusal found while tracing again, naming the leaves
    by their concrete shardings (while tracing, only their types were known);
    a tree on another mesh is named as such first, with both shardings."""
    refuse_foreign(lays[0], lays[1:], [sharding_of(x) for x in lays[0].leaves])
    named = {path for path, _ in error.problems}
    where = [
        (path, x, lay.label)
        for lay in lays
        for path, x in zip(lay.paths(), lay.leaves)
        if path in named
    ]
    if where:
        raise sharding_refused(cause, where) from cause


def run_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    layouts: Callable[[], Sequence[LabelledTree]],
    hyper: dict[str, Any],
) -> Any:
    """Calls a compiled step. A treeguard error raised while tracing comes out
    as raised (without JAX's note about its own frames); JAX's errors about the
    arguments go through ``diagnose``."""
    try:
        return fn(*args)
    except TreeguardError as e:
        notes = getattr(e, "__notes__", None)
        if notes:
            notes[:] = [n for n in notes if "JAX has removed its internal frames" not in n]
        cause = e.__cause__
        if isinstance(e, InvalidTreeError) and cause is not None and refused_layout(cause):
            _name_refused_leaves(e, cause, layouts())
        raise
    except Exception as e:
        if isinstance(e, (TypeError, ValueError, RuntimeError)) or from_jax(e):
            explain_step_error(e, layouts, hyper)
        raise
