"""``nan_origin``: every equation where a NaN or an infinity is born.

The function is traced and run op by op (each equation dispatched alone,
loops iteration by iteration), and every equation whose float inputs are all
finite and whose output is not is recorded, with its source line. Nothing
halts at the first one. With ``grad=True`` the backward pass (the
transposed equations of ``jax.grad``) is searched too. A non-finite value
that a ``where`` hides from the outputs is flagged ``masked``; if the
gradient is then non-finite, it ``poisons_gradient``: the double-``where``
case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import numpy as np

from ..equation import site
from ..leaf import summarize
from ..nonfinite import host_nan_inf, host_nonfinite
from . import jaxpr as jx

Phase = Literal["forward", "backward"]


@dataclasses.dataclass(frozen=True)
class NanSite:
    """One equation with finite inputs and a non-finite output.

    Attributes:
      index: where it is in the jaxpr (``"4"``, ``"2/0"``, ``"1@3/0"`` for
        body equation 0 of iteration 3 of the loop at 1).
      primitive: the primitive's name (``log``).
      source: the user line, ``model.py:88 (apply)``.
      phase: ``forward`` or ``backward``.
      kind: ``nan``, ``inf`` or ``nan+inf``.
      count: how many elements of its outputs are non-finite.
      summary: its first non-finite output as ``f32[3]``.
      inputs: its inputs' summaries.
      masked: the function's outputs are all finite although this value is
        not: a ``where`` or a ``select`` hides it.
      poisons_gradient: masked, and the gradient is non-finite.
    """

    index: str
    primitive: str
    source: str
    phase: Phase
    kind: str
    count: int
    summary: str
    inputs: tuple[str, ...]
    masked: bool = False
    poisons_gradient: bool = False

    def describe(self) -> str:
        """One line.

        Example:
          >>> print(NanSite("1", "log", "m.py:3 (f)", "forward", "nan", 2, "f32[4]",
          ...               ("f32[4]",)).describe())
          forward equation 1 (log) at m.py:3 (f): 2 nan in f32[4] from finite inputs f32[4]
        """
        flag = ""
        if self.poisons_gradient:
            flag = " (masked by a where, and it poisons the gradient)"
        elif self.masked:
            flag = " (masked by a where)"
        return (
            f"{self.phase} equation {self.index} ({self.primitive}) at {self.source}: "
            f"{self.count} {self.kind} in {self.summary} from finite inputs "
            f"{', '.join(self.inputs) or '(none)'}{flag}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _finite(x: Any) -> bool:
    return host_nonfinite(x) == 0


def _arrays(vals: list[Any]) -> list[Any]:
    return [v for v in vals if hasattr(v, "dtype") and jx.is_array(v)]


def _sites(
    closed: Any, args: list[Any], phase_of: Callable[[str], Phase | None]
) -> tuple[list[NanSite], list[Any]]:
    found: list[NanSite] = []

    def hook(eqn: Any, invals: list[Any], outs: list[Any], where: str, stack: str) -> None:
        if jx.has_body(eqn):
            return
        phase = phase_of(stack)
        if phase is None:
            return
        ins, res = _arrays(invals), _arrays(outs)
        if not all(_finite(x) for x in ins) or all(_finite(x) for x in res):
            return
        nan = inf = 0
        first = None
        for x in res:
            n, i = host_nan_inf(x)
            nan, inf = nan + n, inf + i
            if first is None and (n or i):
                first = x
        kind = "+".join(k for k, c in (("nan", nan), ("inf", inf)) if c)
        a = np.asarray(first)
        found.append(
            NanSite(
                where,
                eqn.primitive.name,
                site(eqn)[0],
                phase,
                kind,
                nan + inf,
                summarize(a.shape, a.dtype),
                tuple(summarize(np.shape(x), np.asarray(x).dtype) for x in ins),
            )
        )

    outs = jx.interpret(closed, args, hook=hook).outputs
    return found, outs


def nan_origin(fn: Callable[..., Any], /, *args: Any, grad: bool = False) -> list[NanSite]:
    """Every equation where a NaN or an infinity is born, forward and (with
    ``grad``) backward, never halting at the first.

    Args:
      fn: the function (for ``grad``, scalar-valued; differentiated by its
        first argument).
      *args: its arguments.
      grad: also search the backward pass of ``jax.grad(fn)``.

    Returns:
      One ``NanSite`` per equation with finite inputs and a non-finite
      output, forward sites first, each pass in execution order.

    Example:
      >>> import jax.numpy as jnp
      >>> def f(x):
      ...     return jnp.log(x - 2.0)
      >>> [(s.primitive, s.kind) for s in nan_origin(f, jnp.linspace(0.0, 1.0, 4))]
      [('log', 'nan')]
    """
    closed, _ = jx.as_closed(fn, *args)
    flat = jax.tree.leaves(args)
    forward, outs = _sites(closed, flat, lambda stack: "forward")
    outputs_finite = all(_finite(x) for x in _arrays(outs))
    backward: list[NanSite] = []
    grads_finite = True
    if grad:
        gclosed, _ = jx.as_closed(jax.grad(fn), *args)
        backward, gouts = _sites(
            gclosed, flat, lambda stack: "backward" if "transpose" in stack else None
        )
        grads_finite = all(_finite(x) for x in _arrays(gouts))
    if outputs_finite:
        forward = [
            dataclasses.replace(s, masked=True, poisons_gradient=grad and not grads_finite)
            for s in forward
        ]
    return forward + backward
