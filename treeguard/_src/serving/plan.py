"""``serve plan``: ahead-of-time compile of every bucket, with its cost.

Each bucket is compiled with ``jax.jit(apply).trace(...).lower().compile()``
on abstract params and inputs, so nothing is allocated for the data. The
plan records the compile time and ``memory_analysis()`` of each, and whether
the params plus the largest bucket's working memory fit a budget.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax

from ..spec import TreeSpec, spec_of
from ..verify.model import Model
from .spec import ServingSpec


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """The cost of one bucket.

    Attributes:
      bucket: the batch size.
      compile_s: trace, lower and compile time.
      argument_bytes, output_bytes, temp_bytes, code_bytes: from
        ``memory_analysis()`` (0 where the backend reports none).
    """

    bucket: int
    compile_s: float
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    code_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes + self.code_bytes


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every bucket's cost, and the memory the largest needs beside the params.

    Attributes:
      buckets: one ``BucketPlan`` per bucket, in order.
      params_bytes: the params' bytes.
      peak_bytes: params plus the largest bucket's inputs, outputs and temps.
      budget: the budget checked, or None.
    """

    buckets: tuple[BucketPlan, ...]
    params_bytes: int
    peak_bytes: int
    budget: int | None

    @property
    def fits(self) -> bool:
        return self.budget is None or self.peak_bytes <= self.budget

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": [dataclasses.asdict(b) for b in self.buckets],
            "params_bytes": self.params_bytes,
            "peak_bytes": self.peak_bytes,
            "budget": self.budget,
            "fits": self.fits,
        }


def _fresh(apply: Any) -> Any:
    def planned(params: Any, batch: Any) -> Any:
        return apply(params, batch)

    return planned


def plan(
    model: Model,
    spec: ServingSpec,
    /,
    *,
    params: Any = None,
    budget: int | None = None,
) -> Plan:
    """Compiles every bucket ahead of time and measures it.

    Args:
      model: the ``treeguard.verify.Model``.
      spec: the ``ServingSpec`` whose buckets are compiled.
      params: the params (or their ``TreeSpec``); default the model's
        stored params spec, else ``init``'s shapes.
      budget: bytes that params plus the largest bucket must fit in.

    Returns:
      The ``Plan``; ``plan.fits`` is False over the budget.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> p = plan(model, ServingSpec.from_model(model, inputs=["['x']"], buckets=(8,)))
      >>> [b.bucket for b in p.buckets], p.fits
      ([8], True)
    """
    if params is None:
        params = model.stored_params_spec() or jax.eval_shape(model.init, model.key())
    pspec = params if isinstance(params, TreeSpec) else spec_of(params)
    abstract_params = pspec.abstract()
    params_bytes = int(pspec.nbytes or 0)
    fn = jax.jit(_fresh(model.apply))  # its own cache: every bucket truly compiles
    out = []
    for b in spec.buckets:
        batch = spec.inputs.abstract({"B": b})
        start = time.perf_counter()
        compiled = fn.trace(abstract_params, batch).lower().compile()
        seconds = time.perf_counter() - start
        mem = compiled.memory_analysis()

        def get(name: str, mem: Any = mem) -> int:
            return int(getattr(mem, name, 0) or 0) if mem is not None else 0

        out.append(
            BucketPlan(
                b,
                seconds,
                get("argument_size_in_bytes"),
                get("output_size_in_bytes"),
                get("temp_size_in_bytes"),
                get("generated_code_size_in_bytes"),
            )
        )
    largest = out[-1]
    # the arguments include the params once; count them once
    peak = max(params_bytes, largest.argument_bytes) + largest.output_bytes + largest.temp_bytes
    return Plan(tuple(out), params_bytes, peak, budget)
