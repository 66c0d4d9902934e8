"""``Budgets``: the limits a benchmark result must keep (compile seconds,
p95 latency, temporary bytes), and the evidence when it does not."""

from __future__ import annotations

import dataclasses
import math

from ..display import fmt_bytes, fmt_s, fmt_seconds
from ..errors import BenchError
from .run import BenchResult


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budgets:
    """Performance budgets; None leaves a quantity unlimited.

    Attributes:
      compile_s: the most seconds tracing, lowering and compiling may take.
      p95_s: the most seconds the 95th percentile of the samples may be.
      temp_bytes: the most temporary bytes the compiled program may use
        (``memory_analysis().temp_size_in_bytes``).

    Example:
      >>> Budgets(p95_s=0.01).describe()
      'p95 <= 10 ms'
    """

    compile_s: float | None = None
    p95_s: float | None = None
    temp_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("compile_s", "p95_s", "temp_bytes"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise BenchError(f"Budgets.{name} is {v!r}", hint="a finite number >= 0, or None")
            if v < 0:
                raise BenchError(f"Budgets.{name} is {v!r}", hint="a budget is >= 0")

    def describe(self) -> str:
        parts = []
        if self.compile_s is not None:
            parts.append(f"compile <= {fmt_s(self.compile_s)}")
        if self.p95_s is not None:
            parts.append(f"p95 <= {fmt_s(self.p95_s)}")
        if self.temp_bytes is not None:
            parts.append(f"temp <= {fmt_bytes(self.temp_bytes)}")
        return ", ".join(parts) or "no budgets"

    def violations(self, result: BenchResult, /) -> list[str]:
        """One line for each budget ``result`` exceeds, naming both values.

        A budget on temporary bytes that the backend gives no analysis for
        is a violation too: the budget cannot be shown to hold.

        Args:
          result: the benchmark result.

        Returns:
          The lines; empty when every budget holds.

        Example:
          >>> import jax.numpy as jnp
          >>> from treeguard.bench import run
          >>> r = run(jnp.sin, jnp.ones(4), samples=3, min_time=0.0)
          >>> Budgets(p95_s=0.0).violations(r)[0].startswith("sin: p95 ")
          True
        """
        out = []
        where = result.name
        if self.compile_s is not None and result.compile_total_s > self.compile_s:
            out.append(
                f"{where}: compile {fmt_s(result.compile_total_s)} (trace "
                f"{fmt_seconds(result.phases.get('trace_s'))}, lower "
                f"{fmt_seconds(result.phases.get('lower_s'))}, compile "
                f"{fmt_seconds(result.phases.get('compile_s'))}) over the budget "
                f"{fmt_s(self.compile_s)}"
            )
        if self.p95_s is not None and result.stats.p95 > self.p95_s:
            s = result.stats
            out.append(
                f"{where}: p95 {fmt_s(s.p95)} over the budget {fmt_s(self.p95_s)} "
                f"(median {fmt_s(s.median)}, {s.n} samples of {result.loops} call(s))"
            )
        if self.temp_bytes is not None:
            temp = (result.memory or {}).get("temp")
            if temp is None:
                out.append(
                    f"{where}: the backend gives no memory analysis, so the temp budget "
                    f"{fmt_bytes(self.temp_bytes)} cannot be checked"
                )
            elif temp > self.temp_bytes:
                out.append(
                    f"{where}: temp {fmt_bytes(temp)} ({temp} bytes) over the budget "
                    f"{fmt_bytes(self.temp_bytes)} ({self.temp_bytes} bytes)"
                )
        return out
