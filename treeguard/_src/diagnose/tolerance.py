"""The fp64-relative rule of a diagnosis (the tolerance policy itself is
``treeguard/_src/tolerance.py``).

With ``TolerancePolicy.fp64`` set, a leaf beyond its ``allclose`` tolerance
still passes when its error against an fp64 run of the reference is at most
``fp64`` times the reference's own error plus ``atol / 10``: the candidate
is then no worse than the reference, only different.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tolerance import Tolerance
from ..verify.compare import as_float64


def rmse(a: Any, b: Any) -> float:
    x, y = as_float64(a), as_float64(b)
    if x.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.sqrt(np.mean((x - y) ** 2)))


def fp64_passes(
    candidate: Any, reference: Any, fp64: Any, tol: Tolerance, multiplier: float
) -> bool:
    """The fp64-relative rule: the candidate's RMSE against fp64 is at most
    ``multiplier`` times the reference's plus ``atol / 10``.

    Example:
      >>> ref64 = np.float64([1.0, 2.0])
      >>> fp64_passes(np.float32([1.001, 2.0]), np.float32([1.0, 2.001]), ref64,
      ...             Tolerance(0.0, 1e-6), 2.0)
      True
      >>> fp64_passes(np.float32([1.1, 2.0]), np.float32([1.0, 2.001]), ref64,
      ...             Tolerance(0.0, 1e-6), 2.0)
      False
    """
    return rmse(candidate, fp64) <= multiplier * rmse(reference, fp64) + tol.atol / 10
