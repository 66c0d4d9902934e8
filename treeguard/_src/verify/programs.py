"""The model's functions, compiled once and shared by every check.

Eager JAX compiles each operation on its own, once per shape, so a check
that runs ``apply``, ``loss`` and ``grad`` eagerly on every case pays for
hundreds of small compilations. Here ``init``, one ``evaluate`` (outputs,
loss and grads together), its per-example ``vmap`` twin and one training
step are each compiled once per batch shape, and each case's results are
kept, so the contract, finite, transforms, regression and training checks
and the recording of references share them. Only the ``transforms`` check's
eager reference and the ``negative`` check (which must see ``apply`` refuse
concrete values) run op by op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .cases import Case
from .model import Model

#: XLA options of the programs here. Each runs a few times on small batches,
#: so compiling fast matters more than running fast: without LLVM's
#: optimisations an nnx CNN's ``init`` (threefry and truncated normals)
#: compiles about 10x faster on CPU.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


#: A program of more equations than this, repeating each distinct operation
#: more than ``_REPEATS`` times on average (a deep stack of equal layers
#: written as a Python loop), runs eagerly: XLA's compile time grows with the
#: program, while eager JAX compiles each distinct operation once.
_LARGE, _REPEATS = 1500, 8


def _sizes(jaxpr: Any, seen: set[tuple[str, str]]) -> int:
    """The equations of ``jaxpr`` and its sub-programs; their distinct
    (primitive, operand types) are added to ``seen``."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        seen.add((eqn.primitive.name, ",".join(str(v.aval) for v in eqn.invars)))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _sizes(inner, seen)
    return n


def prefers_eager(fn: Callable[..., Any], *args: Any) -> bool:
    """Whether ``fn(*args)`` compiles faster op by op than as one program.

    Example:
      >>> def deep(x):
      ...     for _ in range(2000):
      ...         x = x * 2.0
      ...     return x
      >>> prefers_eager(deep, 1.0), prefers_eager(lambda x: x * 2.0, 1.0)
      (True, False)
    """
    seen: set[tuple[str, str]] = set()
    n = _sizes(jax.make_jaxpr(fn)(*args).jaxpr, seen)
    return n > _LARGE and n > _REPEATS * len(seen)


class _Compiled:
    """``fn`` under ``jax.jit`` with ``COMPILER_OPTIONS``, or run eagerly when
    ``prefers_eager`` says so on the first call."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.jitted = jax.jit(fn, compiler_options=COMPILER_OPTIONS)
        self.eager: bool | None = None

    def __call__(self, *args: Any) -> Any:
        if self.eager is None:
            self.eager = prefers_eager(self.fn, *args)
        return self.fn(*args) if self.eager else self.jitted(*args)


def compiled(fn: Callable[..., Any]) -> Any:
    """``fn`` compiled with ``COMPILER_OPTIONS`` (or eager, see ``prefers_eager``)."""
    return _Compiled(fn)


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """What the model gives on one batch: ``apply``'s outputs, the loss and its grads."""

    outputs: Any
    loss: Any
    grads: Any


@dataclasses.dataclass(frozen=True)
class Step:
    """One training step's results.

    Attributes:
      loss: the loss before the step.
      updates: the optimizer's updates (``optimizer=`` models), else None.
      params: the params after the step.
      opt_state: the optimizer state after the step (None without one).
    """

    loss: Any
    updates: Any
    params: Any
    opt_state: Any


def as_jax(batch: Any) -> Any:
    """A batch of numpy arrays as JAX arrays."""
    return jax.tree.map(jnp.asarray, batch)


def per_example_apply(model: Model, params: Any, batch: Any) -> Any:
    """``apply`` on each example alone, under vmap, stacked back along the batch axis."""

    def one(example: Any) -> Any:
        return model.apply(params, jax.tree.map(lambda x: x[None], example))

    out = jax.vmap(one)(batch)
    return jax.tree.map(lambda x: x[:, 0], out)


def _vmapped(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` under vmap over a leading axis of size 1 added to every argument."""

    def run(*args: Any) -> Any:
        out = jax.vmap(f)(*jax.tree.map(lambda x: x[None], args))
        return jax.tree.map(lambda x: x[0], out)

    return run


def _same_structure(a: Any, b: Any) -> bool:
    return bool(jax.tree.structure(a) == jax.tree.structure(b))  # type: ignore[operator]


def update_function(model: Model) -> Callable[[Any, Any, Any], Step] | None:
    """``update(params, grads, opt_state) -> Step`` (its ``loss`` None): the
    model's optimizer step without the gradient.

    With ``optimizer=`` the updates are added to the params (optax's
    convention); with ``opt_init=`` it is ``update(params, grads, opt_state)``;
    else ``update(params, grads)``. None when the model has no update.
    """
    opt = model.optimizer
    update = model.update
    if opt is not None:

        def optax_update(params: Any, grads: Any, state: Any) -> Step:
            updates, state = opt.update(grads, state, params)
            if not _same_structure(updates, params):
                return Step(None, updates, params, state)  # reported from the updates
            new = jax.tree.map(lambda p, u: p + u, params, updates)
            return Step(None, updates, new, state)

        return optax_update
    if update is None:
        return None
    if model.opt_init is not None:

        def stateful_update(params: Any, grads: Any, state: Any) -> Step:
            new, state = update(params, grads, state)
            return Step(None, None, new, state)

        return stateful_update

    def sgd_update(params: Any, grads: Any, state: Any) -> Step:
        return Step(None, None, update(params, grads), None)

    return sgd_update


def step_function(model: Model) -> Callable[[Any, Any, Any], Step] | None:
    """``step(params, opt_state, batch) -> Step``: the loss, its grads and
    ``update_function``'s step, as one function (for tracing)."""
    apply_update = update_function(model)
    if apply_update is None:
        return None
    vg = jax.value_and_grad(model.loss)

    def step(params: Any, state: Any, batch: Any) -> Step:
        value, grads = vg(params, batch)
        return dataclasses.replace(apply_update(params, grads, state), loss=value)

    return step


jax.tree_util.register_dataclass(
    Step, data_fields=["loss", "updates", "params", "opt_state"], meta_fields=[]
)
jax.tree_util.register_dataclass(
    Evaluated, data_fields=["outputs", "loss", "grads"], meta_fields=[]
)


class Programs:
    """The compiled functions of one model and the results they gave.

    Attributes:
      model: the model.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        grad = jax.grad(model.loss)

        def evaluate(params: Any, batch: Any) -> tuple[Evaluated, Evaluated]:
            value, grads = jax.value_and_grad(model.loss)(params, batch)
            vmapped = Evaluated(
                per_example_apply(model, params, batch),
                _vmapped(model.loss)(params, batch),
                _vmapped(grad)(params, batch),
            )
            return Evaluated(model.apply(params, batch), value, grads), vmapped

        # One program per batch shape computes both the plain and the
        # per-example (vmap) results: one compilation instead of two.
        self.evaluate = compiled(evaluate)
        apply_update = update_function(model)
        self._update = compiled(apply_update) if apply_update is not None else None
        self._params: Any = None
        self._opt_state: Any = None
        self._done: dict[tuple[str, int], tuple[Evaluated, Evaluated]] = {}

    def params(self) -> Any:
        """``init``'s params for the model's seed, computed once, under ``jit``.

        An ``init`` that cannot be traced (it reads a file, converts to
        numpy) runs eagerly instead.
        """
        if self._params is None:
            key = self.model.key()
            try:
                self._params = compiled(self.model.init)(key)
            except Exception:  # noqa: BLE001 - untraceable: run it as written
                self._params = self.model.init(key)
        return self._params

    def opt_state(self) -> Any:
        """The optimizer state for ``params()`` (None for a model without one)."""
        if self._opt_state is None:
            if self.model.optimizer is not None:
                self._opt_state = compiled(self.model.optimizer.init)(self.params())
            elif self.model.opt_init is not None:
                self._opt_state = compiled(self.model.opt_init)(self.params())
        return self._opt_state

    @property
    def trains(self) -> bool:
        """Whether the model has an update or an optimizer."""
        return self._update is not None

    def step(self, params: Any, state: Any, batch: Any) -> Step:
        """One training step: the grads from the shared ``evaluate`` program (so
        no second gradient is compiled), then the compiled update."""
        assert self._update is not None
        result = self.evaluate(params, batch)[0]
        out: Step = self._update(params, result.grads, state)
        return dataclasses.replace(out, loss=result.loss)

    def _both(self, case: Case) -> tuple[Evaluated, Evaluated]:
        key = (case.name, id(case.batch))
        if key not in self._done:
            self._done[key] = self.evaluate(self.params(), as_jax(case.batch))
        return self._done[key]

    def results(self, case: Case) -> Evaluated:
        """``jit``'s outputs, loss and grads on ``case`` with ``params()`` (kept per case)."""
        return self._both(case)[0]

    def vmapped(self, case: Case) -> Evaluated:
        """The same under ``jit(vmap)``, one example at a time (kept per case)."""
        return self._both(case)[1]

    def eager(self, case: Case) -> Evaluated:
        """The same, op by op, as the reference of the ``transforms`` check."""
        params, batch = self.params(), as_jax(case.batch)
        value, grads = jax.value_and_grad(self.model.loss)(params, batch)
        return Evaluated(self.model.apply(params, batch), value, grads)
