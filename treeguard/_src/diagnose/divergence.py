"""The vocabulary ``locate`` and recorded traces share: the located ``Site``,
the ``Divergence`` found, and the ``Judge`` that compares values at explicit
tolerances while counting the candidate's runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from ..errors import DiagnosisError
from ..tolerance import TolerancePolicy
from ..verify.compare import LeafError, leaf_error
from . import jaxpr as jx

#: Runs a closed jaxpr on concrete flat arguments and returns its flat outputs.
Backend = Callable[[Any, Sequence[Any]], list[Any]]

Role = Literal["culprit", "propagator", "fused"]
Outcome = Literal["none", "located", "trace", "vanishes"]

#: How many downstream diverging equations are isolated and listed.
PROPAGATORS_LISTED = 5


def op_by_op(closed: Any, args: Sequence[Any]) -> list[Any]:
    """The eager backend: every equation dispatched alone (the reference)."""
    return jx.interpret(closed, args).outputs


@dataclasses.dataclass(frozen=True)
class Site:
    """One located equation.

    Attributes:
      index: where it is: ``"12"`` at the top level, ``"12/3"`` inside
        equation 12's body, ``"12@5/3"`` body equation 3 of iteration 5 of
        the loop at 12, ``"12/branch1/0"`` in a cond's branch.
      primitive: the primitive's name (``dot_general``).
      source: the user line, ``model.py:88 (apply)``.
      name_stack: the transformations it came through (``transpose(jvp())``).
      role: ``culprit`` (it diverges alone on the reference's inputs),
        ``propagator`` (clean alone: its inputs carry the divergence in), or
        ``fused`` (clean alone although its inputs are clean: it diverges
        only compiled together with its neighbours).
      iteration: the loop iteration, for an equation in a loop body.
      errors: one ``LeafError`` per output (paths ``out0``, ``out1``...).
      text: the equation's first line.
    """

    index: str
    primitive: str
    source: str
    name_stack: str
    role: Role
    iteration: int | None
    errors: tuple[LeafError, ...]
    text: str

    def describe(self) -> str:
        """One line: ``equation 12 (sin) at model.py:88 (apply): culprit, ...``.

        Example:
          >>> from treeguard.verify import Tolerance
          >>> err = LeafError("out0", "f32[3]", 0.5, 0.5, 5e4, Tolerance(1e-5, 1e-5), 3, 3)
          >>> print(Site("4", "sin", "m.py:9 (f)", "", "culprit", None, (err,), "").describe())
          equation 4 (sin) at m.py:9 (f): culprit, out0 f32[3]: 3 of 3 elements beyond
          tolerance, max abs err 0.5, max rel err 0.5 (rtol 1e-05, atol 1e-05)
        """
        it = f", iteration {self.iteration}" if self.iteration is not None else ""
        worst = max(self.errors, key=lambda e: e.ratio) if self.errors else None
        tail = f", {worst.describe()}" if worst is not None and not worst.ok else ""
        return f"equation {self.index} ({self.primitive}) at {self.source}{it}: {self.role}{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "primitive": self.primitive,
            "source": self.source,
            "name_stack": self.name_stack,
            "role": self.role,
            "iteration": self.iteration,
            "errors": [e.to_dict() for e in self.errors],
            "text": self.text,
        }


@dataclasses.dataclass(frozen=True)
class Divergence:
    """What ``locate`` found.

    Attributes:
      reference: ``eager`` (or ``eager, per example`` for vmap).
      candidate: the candidate's name.
      outcome: ``none`` (no output leaf diverges), ``located`` (an equation
        is found), ``trace`` (the traced program already differs when run
        op by op: the divergence is in what was traced), ``vanishes`` (the
        outputs diverge but cutting the program makes it go away).
      classification: ``precision`` (gone under matmul precision
        ``highest``), ``compilation``, ``trace``, ``batching``, ``fusion``,
        or None when nothing diverges.
      leaves: one ``LeafError`` per output leaf, by key path.
      equation: the innermost located equation, or None.
      enclosing: the equations it sits in, outermost first (a ``jit``, a
        ``scan``...).
      propagators: downstream equations that diverge too, with their roles.
      reaches: the output key paths the located equation's values reach.
      n_equations: equations in the top-level jaxpr.
      compiles: how many candidate programs were run.
      seconds: how long ``locate`` took.
      notes: what the search saw, in order, for the report.
      reproducible: False when a re-run at ``k - 1`` or ``k`` gave another answer.
      tolerances: the tolerances used.
      environment: for a recorded trace, ``(key, recorded, here)`` for
        each environment difference.
    """

    reference: str
    candidate: str
    outcome: Outcome
    classification: str | None
    leaves: tuple[LeafError, ...]
    equation: Site | None = None
    enclosing: tuple[Site, ...] = ()
    propagators: tuple[Site, ...] = ()
    reaches: tuple[str, ...] = ()
    n_equations: int = 0
    compiles: int = 0
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    reproducible: bool = True
    tolerances: dict[str, Any] = dataclasses.field(default_factory=dict)
    environment: tuple[tuple[str, Any, Any], ...] = ()

    @property
    def diverged(self) -> bool:
        return self.outcome != "none"

    @property
    def exit_code(self) -> int:
        """0 no divergence, 1 located (or in the trace), 3 found but not reproducible when cut."""
        if self.outcome == "none":
            return 0
        if self.outcome == "vanishes" or not self.reproducible:
            return 3
        return 1

    @property
    def worst(self) -> LeafError | None:
        bad = [e for e in self.leaves if not e.ok]
        return max(bad, key=lambda e: e.ratio) if bad else None

    def describe(self) -> str:
        """A few lines for a terminal."""
        head = f"{self.candidate} vs {self.reference}: "
        if self.outcome == "none":
            return head + f"no divergence on {len(self.leaves)} output leaves"
        lines = [head + f"{sum(not e.ok for e in self.leaves)} output leaves diverge"]
        if self.worst is not None:
            lines.append(f"  worst leaf: {self.worst.describe()}")
        for s in self.enclosing:
            lines.append(f"  in equation {s.index} ({s.primitive}) at {s.source}")
        if self.equation is not None:
            lines.append(f"  first diverging {self.equation.describe()}")
        if self.reaches:
            lines.append(f"  reaches outputs {', '.join(self.reaches)}")
        for p in self.propagators:
            lines.append(f"  then {p.describe()}")
        lines.append(f"  outcome {self.outcome}, cause {self.classification}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "outcome": self.outcome,
            "classification": self.classification,
            "exit_code": self.exit_code,
            "leaves": [e.to_dict() for e in self.leaves],
            "equation": self.equation.to_dict() if self.equation else None,
            "enclosing": [s.to_dict() for s in self.enclosing],
            "propagators": [s.to_dict() for s in self.propagators],
            "reaches": list(self.reaches),
            "n_equations": self.n_equations,
            "compiles": self.compiles,
            "seconds": round(self.seconds, 6),
            "notes": list(self.notes),
            "reproducible": self.reproducible,
            "tolerances": self.tolerances,
            "environment": [
                {"key": k, "recorded": _plain(a), "here": _plain(b)} for k, a, b in self.environment
            ],
        }


def _plain(x: Any) -> Any:
    return x if x is None or isinstance(x, (str, int, float, bool)) else str(x)


class Judge:
    """Compares values at explicit tolerances, and counts candidate runs."""

    def __init__(self, tolerances: TolerancePolicy, backend: Backend) -> None:
        self.tolerances = tolerances
        self.backend = backend
        self.compiles = 0

    def run(self, closed: Any, args: Sequence[Any]) -> list[Any]:
        self.compiles += 1
        outs = list(self.backend(closed, list(args)))
        if len(outs) != len(closed.jaxpr.outvars):
            raise DiagnosisError(
                f"the candidate's backend returned {len(outs)} outputs for a program of "
                f"{len(closed.jaxpr.outvars)}",
                hint="a backend must run the closed jaxpr it is given and return one value "
                "per output variable",
            )
        return outs

    def error(self, actual: Any, expected: Any, path: str) -> LeafError:
        dtype = np.asarray(expected).dtype
        return leaf_error(actual, expected, self.tolerances.for_leaf(path, dtype), path=path)

    def differs(self, actual: Any, expected: Any, path: str = "") -> bool:
        return not self.error(actual, expected, path).ok

    def errors(self, outs: Sequence[Any], refs: Sequence[Any]) -> tuple[LeafError, ...]:
        return tuple(self.error(a, e, f"out{i}") for i, (a, e) in enumerate(zip(outs, refs)))
