"""A checked optax step: ``optimizer.update`` plus the checked apply, with an
optimizer state that may not drift in structure, shape or dtype.

optax is duck-typed here (an object with ``init`` and ``update``), so this
module does not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .diff import mismatches
from .errors import TracedValueError
from .optstate import migrate_opt_state
from .surgery import Surgery
from .updates.casts import plan_casts
from .updates.compiled import (
    CompiledStep,
    Recorder,
    Shardings,
    finish_step,
    nonfinite_error,
    run_step,
)
from .updates.layout import (
    LabelledTree,
    check_acyclic,
    check_arrays,
    check_layout,
    check_scalars,
    is_tracer,
    labelled_trees,
    mismatch_error,
)
from .updates.policy import TRACED_RAISE, Cast, DtypePolicy, OnNonfinite, StepOptions
from .updates.shardings import pin, pin_leaf
from .walk import flatten

_DRIFT = frozenset(("missing", "unexpected", "node_type", "node_data", "shape", "dim", "dtype"))
_UPDATES = "the updates from optimizer.update"


class OptaxStep:
    """A checked, compiled optax step built by ``optax_step``.

    ``state = step.init(params)``, then ``params, state = step(params, grads,
    state)`` each step. Extra keyword arguments go to ``optimizer.update``
    (e.g. ``value=loss`` for optimizers that take one).

    Attributes:
      optimizer: the wrapped ``optax.GradientTransformation``.
      compile_count: how many signatures have been traced and compiled.
      skipped: how many steps ``on_nonfinite="skip"`` skipped.
      casts: the casts done under ``dtype_policy="cast"``.

    It holds its options and a ``CompiledStep``; it subclasses nothing.
    """

    def __init__(
        self,
        optimizer: Any,
        *,
        dtype_policy: DtypePolicy = "strict",
        donate: bool = False,
        on_nonfinite: OnNonfinite = "raise",
    ) -> None:
        options = StepOptions(dtype_policy, donate, on_nonfinite)
        if not (
            callable(getattr(optimizer, "init", None))
            and callable(getattr(optimizer, "update", None))
        ):
            raise TypeError(
                f"optimizer must have init and update (an optax.GradientTransformation), "
                f"not {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        self.dtype_policy: DtypePolicy = options.dtype_policy
        self.donate = options.donate
        self.on_nonfinite: OnNonfinite = options.on_nonfinite
        # the params (0) pinned with the grads (1) matched to them; the state (2) alone
        self._step = CompiledStep(
            self._body, donated=(0, 2), donate=self.donate, pinned=((0, (1,)), (2, ()))
        )

    @property
    def compile_count(self) -> int:
        """How many signatures have been traced and compiled."""
        return self._step.compile_count

    @property
    def skipped(self) -> int:
        """How many steps ``on_nonfinite="skip"`` skipped (waits for the device)."""
        return self._step.skipped

    @property
    def casts(self) -> tuple[Cast, ...]:
        """Every distinct cast done under ``dtype_policy="cast"``, first seen first."""
        return self._step.casts

    def migrate_opt_state(
        self, old_state: Any, old_params: Any, new_params: Any, /, **options: Any
    ) -> tuple[Any, Surgery]:
        """``treeguard.migrate_opt_state`` with this step's optimizer."""
        return migrate_opt_state(self.optimizer, old_state, old_params, new_params, **options)

    def __repr__(self) -> str:
        return (
            f"OptaxStep(dtype_policy={self.dtype_policy!r}, donate={self.donate}, "
            f"on_nonfinite={self.on_nonfinite!r}, compile_count={self.compile_count})"
        )

    def init(self, params: Any, /) -> Any:
        """``optimizer.init(params)`` after checking that params is a tree of arrays.

        When the params live on a mesh, the state's uncommitted leaves (such
        as adam's step count) are placed on it, replicated, so the first step
        has the same signature as every later one and compiles once.

        Raises:
          InvalidTreeError: for a cyclic tree or a leaf that is not an array.
        """
        check_arrays(labelled_trees([("the params", params)]))
        state = self.optimizer.init(params)
        mesh = next(
            (
                x.sharding.mesh
                for x in jax.tree.leaves(params)
                if isinstance(x, jax.Array)
                and not is_tracer(x)
                and isinstance(x.sharding, jax.sharding.NamedSharding)
            ),
            None,
        )
        if mesh is None:
            return state
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())  # type: ignore[no-untyped-call]
        return jax.tree.map(
            lambda x: (
                jax.device_put(x, replicated)
                if isinstance(x, jax.Array) and not is_tracer(x) and not x.committed
                else x
            ),
            state,
        )

    @staticmethod
    def _labelled(params: Any, grads: Any, state: Any) -> list[tuple[str, Any]]:
        return [("the params", params), ("the grads", grads), ("the state passed in", state)]

    def __call__(self, params: Any, grads: Any, state: Any, /, **extra: Any) -> tuple[Any, Any]:
        """One step: ``(params, grads, state) -> (new_params, new_state)``."""
        check_acyclic((params, grads, state))
        labelled = self._labelled(params, grads, state)
        fn = self._step.function(lambda: labelled, (params, grads, state))
        skip = self.on_nonfinite == "skip"
        out = run_step(
            fn,
            (params, grads, state, extra, self._step.skip_in() if skip else None),
            lambda: labelled_trees(labelled),
            extra,
        )
        if self.on_nonfinite == "ignore":
            return out  # type: ignore[no-any-return]
        (new_params, new_state), flag = out
        if skip:
            self._step.skip_out(flag)
            return new_params, new_state
        if is_tracer(flag):
            raise TracedValueError(TRACED_RAISE)
        if not flag:
            if self.donate:
                checked = labelled_trees([("the grads", grads)])
            else:
                checked = labelled_trees(
                    [("the updated params", new_params), ("the updated state", new_state)]
                )
            raise nonfinite_error(
                checked,
                params=new_params if self.donate else params,
                state=new_state if self.donate else state,
                donate=self.donate,
            )
        return new_params, new_state

    def _body(self, shardings: Shardings, record: Recorder) -> Callable[..., Any]:
        """The traced step: validation, ``optimizer.update`` on grads moved to
        the params' shardings, the checked apply, the drift check, the NaN guard."""
        opt, policy, on, donate = self.optimizer, self.dtype_policy, self.on_nonfinite, self.donate
        p_pin, s_pin = (shardings[0], shardings[1]) if shardings else (None, None)

        def step(params: Any, grads: Any, state: Any, extra: dict[str, Any], skipped: Any) -> Any:
            ref, g_lay, s_lay = labelled_trees(self._labelled(params, grads, state))
            check_layout(ref, [g_lay])
            plan_casts(ref, [g_lay], policy)  # refuses; grads reach the optimizer uncast
            check_scalars(extra)
            _check_state(s_lay, opt, params)
            if p_pin is not None:
                grads = g_lay.treedef.unflatten(
                    [pin_leaf(g, s) for g, s in zip(g_lay.leaves, p_pin)]
                )
            updates, new_state = opt.update(grads, state, params, **extra)
            u_leaves, u_def = flatten(updates)
            u_lay = LabelledTree(_UPDATES, updates, u_leaves, u_def)
            check_layout(ref, [u_lay])
            plan, casts = plan_casts(ref, [u_lay], policy)
            record(casts)
            if p_pin is not None:  # an optimizer may lay its updates out otherwise
                u_leaves = [pin_leaf(u, s) for u, s in zip(u_leaves, p_pin)]
            new_p = [
                p + (u if (0, i) not in plan else u.astype(plan[(0, i)]))
                for i, (p, u) in enumerate(zip(ref.leaves, u_leaves))
            ]
            ns_leaves, ns_def = flatten(new_state)
            _check_drift(
                s_lay,
                LabelledTree("the state optimizer.update returned", new_state, ns_leaves, ns_def),
            )
            n = len(new_p)
            kept, flag = finish_step(
                new_p + ns_leaves, ref.leaves + s_lay.leaves, on, donate, skipped
            )
            out = (
                ref.treedef.unflatten(pin(kept[:n], p_pin)),
                s_lay.treedef.unflatten(pin(kept[n:], s_pin)),
            )
            return out if on == "ignore" else (out, flag)

        return step


def _abstract(tree: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)),  # type: ignore[no-untyped-call]
        tree,
    )


def _check_state(s_lay: LabelledTree, optimizer: Any, params: Any) -> None:
    """The state passed in must look like ``optimizer.init(params)``."""
    expected = jax.eval_shape(optimizer.init, _abstract(params))
    found = [m for m in mismatches(s_lay.tree, expected) if m.kind in _DRIFT]
    if found:
        raise mismatch_error(
            found,
            expected_from="the state optimizer.init makes",
            actual_from=s_lay.label,
            hint="pass the state this optimizer's init made for these params, or the one the "
            "previous step returned",
        )


def _check_drift(before: LabelledTree, after: LabelledTree) -> None:
    """The state returned must keep the structure, shapes and dtypes it came in with."""
    same = after.treedef == before.treedef and all(
        np.shape(a) == np.shape(b) and jax.numpy.result_type(a) == jax.numpy.result_type(b)
        for a, b in zip(before.leaves, after.leaves)
    )
    if same:
        return
    found = [m for m in mismatches(after.tree, before.tree) if m.kind in _DRIFT]
    if not found:
        return
    dtype_only = {m.kind for m in found} == {"dtype"}
    raise mismatch_error(
        found,
        expected_from=before.label,
        actual_from=after.label,
        hint="the optimizer promoted its state (e.g. bf16 moments fed f32 grads); declare "
        "the moment dtype on purpose (optax.adam(..., mu_dtype=jnp.float32)) or give it "
        "grads of the params' dtype"
        if dtype_only
        else "the optimizer's state changed structure or shape between steps",
    )


def optax_step(
    optimizer: Any,
    /,
    *,
    dtype_policy: DtypePolicy = "strict",
    donate: bool = False,
    on_nonfinite: OnNonfinite = "raise",
) -> OptaxStep:
    """Wraps an optax optimizer into a checked, compiled step.

    A step runs ``optimizer.update(grads, state, params)`` and applies the
    updates as ``apply_updates`` does, in one ``jax.jit`` compiled once per
    signature. When a signature is first traced it checks that:

    * the grads have the params' structure and leaf shapes, and their dtypes
      (``"strict"``: equal; ``"cast"``: of the same kind; they reach the
      optimizer uncast);
    * the state passed in looks like ``optimizer.init(params)``;
    * the updates match the params, dtypes by ``dtype_policy`` (``"cast"``
      casts them to the params' dtypes on purpose, reported in
      ``step.casts``);
    * the state returned keeps the structure, shapes and dtypes it came in
      with: a moment drifting to f32 or f64 is an error naming its path.

    Results keep the params' and the state's shardings.

    Args:
      optimizer: an ``optax.GradientTransformation`` (anything with ``init``
        and ``update``).
      dtype_policy: ``"strict"`` or ``"cast"``, as in ``apply_updates``.
      donate: donate the params' and the state's buffers to the step.
      on_nonfinite: ``"raise"``, ``"skip"`` (keep the old params and state,
        count the step) or ``"ignore"``; NaN/Inf is looked for in the new
        params and the new state.

    Returns:
      The ``OptaxStep``.

    Raises:
      ValueError: for an unknown option.
      TypeError: if ``optimizer`` has no ``init`` and ``update``.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> params = {"w": jnp.ones(3, jnp.bfloat16)}
      >>> step = optax_step(optax.adam(1e-2))
      >>> state = step.init(params)
      >>> grads = {"w": jnp.ones(3)}
      >>> step(params, grads, state)
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: 1 mismatch between the grads and the params:
        ['w']: dtype bfloat16 in the params, float32 in the grads
      hint: pass dtype_policy="cast" to cast on purpose (each cast is reported), ...
      >>> params, state = step(params, grads.copy() | {"w": jnp.ones(3, jnp.bfloat16)}, state)
      >>> params["w"].dtype, step.compile_count
      (dtype(bfloat16), 1)
    """
    return OptaxStep(optimizer, dtype_policy=dtype_policy, donate=donate, on_nonfinite=on_nonfinite)
