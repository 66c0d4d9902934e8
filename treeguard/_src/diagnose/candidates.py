"""The candidates ``locate`` runs against the eager reference: ``jit``,
``vmap``, ``grad`` and their compositions, a matmul precision, or a backend
function, each a ``Candidate`` that says how it runs a closed jaxpr."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend.core as jex

from ..errors import DiagnosisError
from .divergence import Backend, op_by_op

#: The names ``jax.default_matmul_precision`` takes.
PRECISIONS = (
    "default",
    "high",
    "highest",
    "bfloat16",
    "tensorfloat32",
    "float32",
    "bfloat16_3x",
    "ANY_F8_ANY_F8_F32",
)


def compiled(closed: Any, args: Sequence[Any]) -> list[Any]:
    """The ``jit`` backend: the whole program compiled as one."""
    return list(jax.jit(jex.jaxpr_as_fun(closed))(*args))


def dispatched(closed: Any, args: Sequence[Any]) -> list[Any]:
    """JAX's own evaluation outside ``jit``: inner ``jit`` calls compile."""
    return list(jex.jaxpr_as_fun(closed)(*args))


def at_precision(precision: str) -> Backend:
    """The ``jit`` backend under ``jax.default_matmul_precision(precision)``."""

    def run(closed: Any, args: Sequence[Any]) -> list[Any]:
        with jax.default_matmul_precision(precision):
            return compiled(closed, args)

    return run


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What runs against the eager reference.

    Attributes:
      name: how reports name it.
      backend: how it runs a closed jaxpr.
      grad: whether the program is ``jax.grad`` of the function (by its
        first argument).
      batched: whether the program is ``jax.vmap`` of the function over the
        leading axis of every argument (the reference then runs each
        example alone).
    """

    name: str
    backend: Backend
    grad: bool = False
    batched: bool = False


#: The named candidates (a matmul precision name is one too).
_NAMED = {
    c.name: c
    for c in (
        Candidate("jit", compiled),
        Candidate("vmap", op_by_op, batched=True),
        Candidate("jit+vmap", compiled, batched=True),
        Candidate("grad", dispatched, grad=True),
        Candidate("jit+grad", compiled, grad=True),
    )
}
#: Their names.
CANDIDATES = tuple(_NAMED)


def candidate_of(candidate: str | Backend | Candidate) -> Candidate:
    """A ``Candidate`` from a name, a matmul precision, or a backend function.

    Raises:
      DiagnosisError: for an unknown name.

    Example:
      >>> candidate_of("jit+grad").grad, candidate_of("bfloat16").name
      (True, 'jit@bfloat16')
    """
    if isinstance(candidate, Candidate):
        return candidate
    if callable(candidate):
        return Candidate(getattr(candidate, "__name__", "backend"), candidate)
    if isinstance(candidate, str) and candidate in _NAMED:
        return _NAMED[candidate]
    if candidate in PRECISIONS:
        return Candidate(f"jit@{candidate}", at_precision(candidate))
    raise DiagnosisError(
        f"unknown candidate {candidate!r}",
        hint=f"one of {', '.join(CANDIDATES)}, a matmul precision "
        f"({', '.join(PRECISIONS[:6])}), a recorded trace or a backend function",
    )
