"""What the checks of ``treeguard verify`` share: the ``Context`` they run in
and the ``CheckResult`` each returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeVar

from ..diff import mismatches
from ..mismatch import Mismatch
from .cases import Case
from .model import Model
from .programs import Programs, as_jax
from .refs import References

Status = Literal["pass", "fail", "skip"]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)


def by_name(results: Sequence[N], name: str, what: str) -> N:
    """The result called ``name`` (a check's, a stage's).

    Raises:
      KeyError: naming the results there are.

    Example:
      >>> by_name([CheckResult("keys", "pass", "ok")], "keys", "check").status
      'pass'
    """
    for r in results:
        if r.name == name:
            return r
    raise KeyError(f"no {what} {name!r}; the {what}s are {[r.name for r in results]}")


#: How many lines of one kind a check's evidence lists before it counts the rest.
LISTED = 12


class _Result(Protocol):
    name: str
    status: Status
    summary: str
    evidence: list[str]
    seconds: float


def result_dict(result: _Result, **details: Any) -> dict[str, Any]:
    """A check's or a stage's JSON form: its name, status, summary and
    evidence, then ``details``, then its time."""
    return {
        "name": result.name,
        "status": result.status,
        "summary": result.summary,
        "evidence": list(result.evidence),
        **details,
        "seconds": round(result.seconds, 6),
    }


@dataclasses.dataclass
class CheckResult:
    """The outcome of one check.

    Attributes:
      name: the check's stable name (one of ``CHECKS``).
      status: ``pass``, ``fail`` or ``skip``.
      summary: one line.
      evidence: the lines that show why: on failure they name the cause
        (the path, the case, the key's origin).
      rows: structured data for the reports (per-leaf tables).
      seconds: how long the check took.
    """

    name: str
    status: Status
    summary: str
    evidence: list[str] = dataclasses.field(default_factory=list)
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def to_dict(self) -> dict[str, Any]:
        return result_dict(self, rows=list(self.rows))


@dataclasses.dataclass
class Context:
    """What the checks share: the model, its params and cases, the references.

    Attributes:
      model: the model under test.
      cases: the cases in use (the stored ones when references exist).
      references: the references read back, or None.
      record: whether this run records new references.
    """

    model: Model
    cases: list[Case]
    references: References | None
    record: bool = False
    bench_result: Any = None  # the run's benchmark of jit(apply), for the performance check
    programs: Programs = dataclasses.field(init=False)
    rejected: dict[str, list[str]] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.programs = Programs(self.model)
        self.rejected = {}
        for case in self.cases:
            if not case.negative:
                found = mismatches(case.batch, self.model.batch_spec)
                if found:
                    self.rejected[case.name] = mismatch_lines(
                        found, f"case {case.name!r}", "the batch spec", "the case"
                    )

    @property
    def positive(self) -> list[Case]:
        """The positive cases whose data match the batch spec (the others are
        rejected by the contract check and run by no other check)."""
        return [c for c in self.cases if not c.negative and c.name not in self.rejected]

    @property
    def negative(self) -> list[Case]:
        return [c for c in self.cases if c.negative]

    def params(self) -> Any:
        """``init``'s params for the model's seed (computed once)."""
        return self.programs.params()

    def batch(self, case: Case) -> Any:
        return as_jax(case.batch)

    def prepare(self) -> None:
        """Computes ahead what the checks share, compiling on a background
        thread while the ``transforms`` check's eager reference runs (see
        ``Programs.prepare``). The checks give the same results without it."""
        self.programs.prepare(self.positive, [self.standard()] if self.positive else [])

    def standard(self) -> Case:
        for c in self.positive:
            if c.name == "standard":
                return c
        return self.positive[0]


def mismatch_lines(
    found: list[Mismatch], where: str, expected_from: str, actual_from: str
) -> list[str]:
    """One evidence line per mismatch, prefixed with ``where``, the first ``LISTED``."""
    out = [f"{where}: {m.describe(expected_from, actual_from)}" for m in found[:LISTED]]
    if len(found) > LISTED:
        out.append(f"{where}: ... and {len(found) - LISTED} more")
    return out


def outcome(
    name: str,
    bad: list[str],
    ok_summary: str,
    fail_summary: str,
    *,
    evidence: list[str] | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> CheckResult:
    """A fail listing ``bad`` (then the other evidence) if there is any, else a pass."""
    info = list(evidence or [])
    if bad:
        return CheckResult(name, "fail", fail_summary, [*bad, *info], list(rows or []))
    return CheckResult(name, "pass", ok_summary, info, list(rows or []))


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, cut to 160 characters."""
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 160 else line[:157] + "..."
