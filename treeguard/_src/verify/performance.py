"""A ``Model``'s performance: its benchmark suite and the ``performance`` check.

The suite times, per batch size, ``jit(apply)`` and ``jit(value_and_grad(loss))``,
and once ``jit(update)`` on the grads of the standard batch (an update does not
depend on the batch size). Every entry goes through ``treeguard.bench.run``:
phases apart, awaited calibrated samples, and a compile in the timed window
makes it invalid.

The ``performance`` check holds the short benchmark of ``jit(apply)`` that
``verify.run`` takes against the model's ``performance`` budgets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..bench.budget import Budgets
from ..bench.conditions import conditions as current_conditions
from ..bench.run import BenchResult, Target, run, run_target
from ..display import fmt_bytes, fmt_seconds
from .cases import Case, _batch
from .context import CheckResult, Context
from .model import Model

#: The batch sizes ``treeguard bench MODULE:ATTR`` times by default.
BATCH_SIZES: tuple[int, ...] = (1, 8, 64)


def model_batch(model: Model, size: int) -> Any:
    """A random batch of ``size`` examples from the model's batch spec and seed.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> model_batch(model, 4)["x"].shape
      (4, 2)
    """
    rng = np.random.Generator(np.random.PCG64(model.seed + size))
    batch = _batch(model.batch_spec, size, "standard", rng, model.bounds)
    return jax.tree.map(jax.numpy.asarray, batch)


def model_targets(model: Model, /, *, batch_sizes: Sequence[int] = BATCH_SIZES) -> list[Target]:
    """The suite of ``model``: ``apply`` and ``loss+grad`` per batch size,
    then ``update`` once.

    Args:
      model: the model.
      batch_sizes: the batch sizes.

    Returns:
      The targets, named like ``apply B=8``.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> [t.label for t in model_targets(model, batch_sizes=(2,))]
      ['apply B=2', 'loss+grad B=2', 'update']
    """
    params = model.init(model.key())
    vg = jax.value_and_grad(model.loss)
    out = []
    for b in batch_sizes:
        batch = model_batch(model, int(b))
        out.append(Target(model.apply, (params, batch), name=f"apply B={b}"))
        out.append(Target(vg, (params, batch), name=f"loss+grad B={b}"))
    if model.update is not None:
        size = batch_sizes[len(batch_sizes) // 2] if batch_sizes else model.batch_size
        grads = jax.grad(model.loss)(params, model_batch(model, int(size)))
        out.append(Target(model.update, (params, grads), name="update"))
    return out


def bench_model(
    model: Model,
    /,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    samples: int = 30,
    min_time: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> list[BenchResult]:
    """Benchmarks ``model``'s suite (see ``model_targets``) on one set of conditions.

    Args:
      model: the model.
      batch_sizes: the batch sizes of ``apply`` and ``loss+grad``.
      samples: timed samples per entry.
      min_time: the least seconds per sample.
      progress: called with each entry's name before it runs.

    Returns:
      One ``BenchResult`` per entry, in suite order.

    Raises:
      BenchError: for bad ``samples`` or ``min_time``.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> rs = bench_model(model, batch_sizes=(), samples=3, min_time=0.0)  # update only
      >>> [(r.name, r.status, r.stats.n) for r in rs]
      [('update', 'ok', 3)]
    """
    conds = current_conditions()
    out = []
    for t in model_targets(model, batch_sizes=batch_sizes):
        if progress is not None:
            progress(t.label)
        meta = {"model": model.name}
        out.append(run_target(t, samples=samples, min_time=min_time, conditions=conds, meta=meta))
    return out


def benchmark_apply(
    model: Model, params: Any, batch: Any, *, samples: int = 20, min_time: float = 0.01
) -> BenchResult:
    """The short benchmark of ``jit(apply)`` on one batch, for the report."""
    batch = jax.tree.map(jax.numpy.asarray, batch)
    return run(
        model.apply,
        params,
        batch,
        samples=samples,
        min_time=min_time,
        name="jit(apply)",
        meta={"batch": Case("standard", batch).summary()},
    )


def check_performance(ctx: Context) -> CheckResult:
    """The short benchmark of ``jit(apply)`` keeps the model's budgets and
    compiles nothing while it is timed."""
    budgets: Budgets | None = getattr(ctx.model, "performance", None)
    if budgets is None:
        return CheckResult("performance", "skip", "the model declares no performance budgets")
    result: BenchResult | None = getattr(ctx, "bench_result", None)
    if result is None:
        std = ctx.standard()
        result = benchmark_apply(ctx.model, ctx.params(), std.batch)
    s = result.stats
    info = [
        f"{result.name} on {result.meta.get('batch', '?')}: median {fmt_seconds(s.median)}, "
        f"p95 {fmt_seconds(s.p95)}, {s.n} samples of {result.loops} call(s)",
        f"compile {fmt_seconds(result.compile_total_s)} (trace "
        f"{fmt_seconds(result.phases.get('trace_s'))}, lower "
        f"{fmt_seconds(result.phases.get('lower_s'))}, compile "
        f"{fmt_seconds(result.phases.get('compile_s'))})",
        f"temp {fmt_bytes((result.memory or {}).get('temp'))}",
        f"budgets: {budgets.describe()}",
    ]
    bad = budgets.violations(result)
    if not result.valid:
        bad.insert(0, f"{result.name}: invalid: {result.reason}")
    row = {"name": result.name, "status": result.status, **_row(result)}
    if bad:
        return CheckResult(
            "performance", "fail", f"{len(bad)} performance budget(s) exceeded", bad + info, [row]
        )
    return CheckResult("performance", "pass", f"within {budgets.describe()}", info, [row])


def _row(result: BenchResult) -> dict[str, Any]:
    s = result.stats
    return {
        "median_s": s.median,
        "p95_s": s.p95,
        "compile_s": result.compile_total_s,
        "temp_bytes": (result.memory or {}).get("temp"),
    }
