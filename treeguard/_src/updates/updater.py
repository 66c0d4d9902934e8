"""Checked updates of params: ``updater`` turns a per-leaf rule into a checked,
compiled step, and ``apply_updates`` is ``params + updates`` under the same
checks. Each ``Updater`` holds a ``CompiledStep``: it validates a call's
signature (structure, shapes, dtypes, shardings) once and compiles the step
once per signature with ``jax.jit``; a later call with that signature costs a
cycle check per tree plus the compiled call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import TracedValueError
from ..mismatch import Mismatch
from .casts import plan_casts, same_kind
from .compiled import CompiledStep, Recorder, Shardings, finish_step, nonfinite_error, run_step
from .layout import (
    check_acyclic,
    check_layout,
    check_scalars,
    is_tracer,
    labelled_trees,
    mismatch_error,
)
from .policy import TRACED_RAISE, Cast, DtypePolicy, OnNonfinite, StepOptions
from .shardings import pin, pin_leaf, refused_layout, sharding_refused


class Updater:
    """A checked, compiled update step built by ``updater``.

    Call it as ``step(params, *trees, **hyper)``. Each tree must have the
    params' structure and leaf shapes; ``fn`` is applied leaf by leaf as
    ``fn(param, *tree_leaves, **hyper)``. Keyword arguments are scalar
    hyperparameters (``lr=0.01``) passed unchanged to every leaf; being jit
    arguments, a new value does not recompile.

    It holds its options (validated ``StepOptions``) and a ``CompiledStep``
    (the jitted functions and the counters); it subclasses nothing.

    Attributes:
      fn: the per-leaf rule.
      dtype_policy, donate, on_nonfinite: the options, as ``updater`` takes them.
      compile_count: how many signatures have been traced and compiled.
      skipped: how many steps ``on_nonfinite="skip"`` skipped.
      casts: the casts done so far under ``dtype_policy="cast"``.
    """

    def __init__(
        self, fn: Callable[..., Any], options: StepOptions, names: Sequence[str] | None = None
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        self.fn = fn
        self.dtype_policy: DtypePolicy = options.dtype_policy
        self.donate = options.donate
        self.on_nonfinite: OnNonfinite = options.on_nonfinite
        self._names = tuple(names) if names is not None else None
        self._step = CompiledStep(self._body, donated=(0,), donate=self.donate)

    @property
    def compile_count(self) -> int:
        """How many times the step has been traced and compiled: once per
        distinct signature (structure, shapes, dtypes, weak types, the x64
        setting and, with several devices, shardings). It stays put over
        steps with one signature."""
        return self._step.compile_count

    @property
    def skipped(self) -> int:
        """How many steps ``on_nonfinite="skip"`` has skipped. Counted on the
        device, so reading it waits for the steps so far; calls made inside
        an outer ``jit`` or ``vmap`` are not counted."""
        return self._step.skipped

    @property
    def casts(self) -> tuple[Cast, ...]:
        """Every distinct cast done under ``dtype_policy="cast"``, over all
        signatures compiled so far, in the order first seen."""
        return self._step.casts

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return (
            f"Updater({name}, dtype_policy={self.dtype_policy!r}, donate={self.donate}, "
            f"on_nonfinite={self.on_nonfinite!r}, compile_count={self.compile_count})"
        )

    def _label(self, j: int, n: int) -> str:
        if self._names is not None and j < len(self._names):
            return f"the {self._names[j]}"
        return "the updates" if n == 1 else f"argument {j + 1}"

    def _labelled(self, params: Any, trees: Sequence[Any]) -> list[tuple[str, Any]]:
        n = len(trees)
        return [("the params", params), *((self._label(j, n), t) for j, t in enumerate(trees))]

    def __call__(self, params: Any, /, *trees: Any, **hyper: Any) -> Any:
        """Applies the step; see ``updater``."""
        check_acyclic((params, *trees))
        fn = self._step.function(lambda: self._labelled(params, trees), (params, *trees))
        skip = self.on_nonfinite == "skip"
        out = run_step(
            fn,
            (params, trees, hyper, self._step.skip_in() if skip else None),
            lambda: labelled_trees(self._labelled(params, trees)),
            hyper,
        )
        if self.on_nonfinite == "ignore":
            return out
        new, extra = out
        if skip:
            self._step.skip_out(extra)
            return new
        if is_tracer(extra):
            raise TracedValueError(TRACED_RAISE)
        if not extra:
            if self.donate:  # the results are gone; name what went in
                checked = labelled_trees(self._labelled(params, trees))[1:]
            else:
                checked = labelled_trees([("the updated params", new)])
            raise nonfinite_error(
                checked, params=new if self.donate else params, donate=self.donate
            )
        return new

    def _body(self, shardings: Shardings, record: Recorder) -> Callable[..., Any]:
        """The traced step: validation, ``fn`` per leaf (each update leaf moved
        to its param's sharding first), the result checks, the NaN guard."""
        fn, policy, on, donate = self.fn, self.dtype_policy, self.on_nonfinite, self.donate
        pinned = shardings[0] if shardings else None

        def step(params: Any, trees: tuple[Any, ...], hyper: dict[str, Any], skipped: Any) -> Any:
            lays = labelled_trees(self._labelled(params, trees))
            ref, others = lays[0], lays[1:]
            check_layout(ref, others)
            plan, casts = plan_casts(ref, others, policy)
            check_scalars(hyper)
            outs: list[Any] = []
            bad: list[Mismatch] = []
            out_casts: list[Cast] = []
            paths = ref.paths
            for i, p in enumerate(ref.leaves):
                args = [
                    o.leaves[i] if (j, i) not in plan else o.leaves[i].astype(plan[(j, i)])
                    for j, o in enumerate(others)
                ]
                try:
                    if pinned is not None:
                        args = [pin_leaf(a, pinned[i]) for a in args]
                    y = fn(p, *args, **hyper)
                except Exception as e:
                    if not refused_layout(e):
                        raise
                    where = [(paths()[i], o.leaves[i], o.label) for o in (ref, *others)]
                    raise sharding_refused(e, where) from e
                outs.append(y)
                if not (hasattr(y, "shape") and hasattr(y, "dtype")):
                    bad.append(Mismatch(paths()[i], "node_type", "leaf", type(y).__name__))
                elif tuple(y.shape) != tuple(p.shape):
                    bad.append(Mismatch(paths()[i], "shape", tuple(p.shape), tuple(y.shape)))
                elif y.dtype != p.dtype:
                    want, got = np.dtype(p.dtype), np.dtype(y.dtype)
                    if policy == "strict" or not same_kind(got, want):
                        bad.append(Mismatch(paths()[i], "dtype", want.name, got.name))
                    else:
                        out_casts.append(Cast(paths()[i], got.name, want.name, _RESULT))
                        outs[-1] = y.astype(want)
            if bad:
                _raise_result(bad, policy)
            record(casts + out_casts)
            new, extra = finish_step(outs, ref.leaves, on, donate, skipped)
            tree = ref.treedef.unflatten(pin(new, pinned))
            return tree if on == "ignore" else (tree, extra)

        return step


_RESULT = "fn's result"


def _raise_result(found: list[Mismatch], policy: DtypePolicy) -> None:
    kinds = {m.kind for m in found}
    if kinds - {"dtype"}:
        hint = (
            "the update rule must return one array of its param's shape per leaf; a "
            "broadcast inside fn changes the shape"
        )
    elif policy == "strict":
        hint = (
            "the update rule promoted the dtype (a strongly typed scalar such as "
            "jnp.asarray(lr) or np.float32(lr), or x64 mode); pass the learning rate as a "
            'Python float, cast inside fn, or pass dtype_policy="cast" to cast on purpose'
        )
    else:
        hint = "the update rule changed the kind of number; cast inside fn on purpose"
    raise mismatch_error(found, expected_from="the params", actual_from=_RESULT, hint=hint)


def updater(
    fn: Callable[..., Any],
    /,
    *,
    dtype_policy: DtypePolicy = "strict",
    donate: bool = False,
    on_nonfinite: OnNonfinite = "raise",
    names: Sequence[str] | None = None,
) -> Updater:
    """Turns a per-leaf update rule into a checked, compiled step.

    The step is called as ``step(params, *trees, **hyper)`` and returns the
    new params. On the first call with a given signature it checks every tree
    against the params (structure and shapes exactly, dtypes by
    ``dtype_policy``, shardings), compiles ``fn`` mapped over the leaves with
    ``jax.jit`` and caches both; later calls with that signature cost one
    flatten per tree and the compiled call. ``fn``'s result must keep each
    param's shape and dtype: a broadcast or promotion inside ``fn`` (a
    strongly typed ``jnp.asarray(lr)``, x64 mode) is refused at trace time.

    Shardings: each result leaf keeps its param's sharding. An update laid
    out differently on the same devices is resharded inside the compiled
    step; one on other devices is refused with a ``sharding`` mismatch.

    Args:
      fn: ``fn(param, *leaves, **hyper) -> new_param`` for one leaf, like the
        seed's ``lambda p, g: p - lr * g``.
      dtype_policy: ``"strict"`` refuses any tree leaf whose dtype differs
        from its param's; ``"cast"`` casts it (and ``fn``'s result) to the
        param's dtype, records each cast in ``step.casts``, and still refuses
        casts that change the kind of number (float to int).
      donate: donate the params' buffers to the step, so it needs no second
        copy of the params; the old params are unusable after the call.
      on_nonfinite: what to do when the new params hold NaN or Inf:
        ``"raise"`` raises ``NonFiniteError`` and keeps the old params (one
        scalar read per step; not available inside an outer ``jit``),
        ``"skip"`` returns the old params bit for bit and counts the step in
        ``step.skipped``, ``"ignore"`` does not look.
      names: how error messages name the trees after the params
        (``("grads",)`` reads "in the grads"); by default "the updates".

    Returns:
      The ``Updater``; ``step.compile_count`` says how often it compiled.

    Raises:
      ValueError: for an unknown ``dtype_policy`` or ``on_nonfinite``.
      TypeError: if ``fn`` is not callable.

    The step raises ``TreeMismatchError`` (structure, shape, dtype, sharding,
    every path at once), ``InvalidTreeError`` (a leaf that is no array, a
    leaked tracer, a donated array), ``NonFiniteError`` and
    ``TracedValueError`` (``"raise"`` inside ``jit``).

    Example:
      >>> import jax.numpy as jnp
      >>> params = {"dense1": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}}
      >>> grads = {"dense1": {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}}
      >>> sgd = updater(lambda p, g, *, lr: p - lr * g)
      >>> new = sgd(params, grads, lr=0.01)
      >>> new["dense1"]["w"][0, 0], new["dense1"]["b"].dtype
      (Array(0.99, dtype=float32), dtype('float32'))
      >>> new = sgd(new, grads, lr=0.02); sgd.compile_count
      1
      >>> sgd(params, {"dense1": {"w": jnp.ones((2, 3)), "b": jnp.ones((2, 3))}}, lr=0.01)
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: 1 mismatch between the updates and the params:
        ['dense1']['b']: shape (3,) in the params, (2, 3) in the updates
      hint: an update of another shape would broadcast silently; ...
    """
    return Updater(fn, StepOptions(dtype_policy, donate, on_nonfinite), names)


def _add(p: Any, u: Any) -> Any:
    return p + u


_APPLY: dict[tuple[str, str], Updater] = {}


def apply_updates(
    params: Any,
    updates: Any,
    /,
    *,
    dtype_policy: DtypePolicy = "strict",
    on_nonfinite: OnNonfinite = "ignore",
    report: bool = False,
) -> Any:
    """``params + updates`` leaf by leaf, checked: optax's ``apply_updates``
    without the silent broadcast, promotion or prefix matching.

    Structure and leaf shapes must match exactly; every mismatching path is
    listed before any arithmetic. Every result leaf has exactly its param's
    shape and dtype. The step is compiled once per signature, so a call costs
    about one flatten per tree plus one compiled call (no per-leaf dispatch).

    Args:
      params: the parameter tree.
      updates: a tree of the params' structure and shapes (already scaled,
        as optax's ``GradientTransformation`` returns them).
      dtype_policy: ``"strict"`` refuses an update whose dtype differs from
        its param's; ``"cast"`` casts it to the param's dtype on purpose
        (never float to int).
      on_nonfinite: ``"ignore"`` (default, as optax), ``"skip"`` or
        ``"raise"``; see ``updater``.
      report: also return the casts done, as a tuple of ``Cast``.

    Returns:
      The new params, or ``(new_params, casts)`` with ``report=True``.

    Raises:
      TreeMismatchError: structure, shape, dtype or device mismatches, by path.
      InvalidTreeError: a leaf that is not an array, a leaked tracer, a
        donated (deleted) array.
      NonFiniteError: with ``on_nonfinite="raise"``.

    Example:
      >>> import jax.numpy as jnp
      >>> params = {"w": jnp.ones(2, jnp.bfloat16), "b": jnp.zeros(2, jnp.bfloat16)}
      >>> updates = {"w": jnp.full(2, -0.5), "b": jnp.ones(2, jnp.bfloat16)}
      >>> apply_updates(params, updates)
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: 1 mismatch between the updates and the params:
        ['w']: dtype bfloat16 in the params, float32 in the updates
      hint: pass dtype_policy="cast" to cast on purpose (each cast is reported), ...
      >>> new, casts = apply_updates(params, updates, dtype_policy="cast", report=True)
      >>> new["w"], [c.describe() for c in casts]
      (Array([0.5, 0.5], dtype=bfloat16), ["['w']: float32 -> bfloat16 in the updates"])
    """
    step = _APPLY.get((dtype_policy, on_nonfinite))
    if step is None:
        step = Updater(_add, StepOptions(dtype_policy, False, on_nonfinite))
        _APPLY[(dtype_policy, on_nonfinite)] = step
    new = step(params, updates)
    if not report:
        return new
    lays = labelled_trees([("the params", params), ("the updates", updates)])
    return new, tuple(plan_casts(lays[0], lays[1:], dtype_policy)[1])
