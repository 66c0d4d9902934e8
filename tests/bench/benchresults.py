"""Benchmark results made by hand for the verdict tests: no clock is read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from treeguard.bench import BenchResult


def ran(samples: Iterable[float], conditions: dict[str, Any]) -> BenchResult:
    """A valid result of ``samples`` (seconds per call) under ``conditions``."""
    return BenchResult(
        name="f",
        status="ok",
        reason="",
        samples_s=tuple(float(s) for s in samples),
        loops=1,
        warmup=0,
        phases={},
        compiles={"warmup": {}, "measure": {}},
        memory=None,
        cost=None,
        conditions=conditions,
    )
