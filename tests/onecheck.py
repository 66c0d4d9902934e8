"""One check of the acceptance protocol alone, on a model's generated cases.

``treeguard.verify.run`` runs every check and compiles the model for each
transform (seconds a run); a test of one check's verdict runs that check alone.
"""

from __future__ import annotations

from typing import Any

# The check table, its context, the generated cases and the per-example hash on purpose:
# they have no public name, and going through ``run`` would make each test cost a whole run.
from treeguard._src.verify import (  # _src: one check alone; run() costs a whole run
    cases,
    checks,
    splits,
)
from treeguard.verify import CheckResult, Model, References

Case = cases.Case
generate_cases = cases.generate_cases
example_hashes = splits.example_hashes

__all__ = ["Case", "check", "context", "example_hashes", "generate_cases", "one_check"]


def context(model: Model, references: References | None = None, *, record: bool = False) -> Any:
    """What the checks share, for ``model`` and its generated cases."""
    return checks.Context(
        model=model, cases=generate_cases(model), references=references, record=record
    )


def check(name: str, ctx: Any) -> CheckResult:
    """Runs the check ``name`` on ``ctx``; an exception inside it propagates."""
    return checks.RUNNERS[name](ctx)


def one_check(
    name: str,
    model: Model,
    references: References | None = None,
    *,
    record: bool = False,
    bench_result: Any = None,
) -> CheckResult:
    """Runs the check ``name`` alone; an exception inside it propagates."""
    ctx = context(model, references, record=record)
    ctx.bench_result = bench_result
    return check(name, ctx)
