"""The one tolerance policy: how close a leaf must be to its reference.

``Tolerance`` is one explicit ``allclose`` pair. ``TolerancePolicy`` says
which pair a leaf gets: the first path rule whose glob matches its key path,
else its dtype's, else the default (``DTYPE_DEFAULTS`` for its dtype when no
default is set). Integer, boolean and key leaves are compared exactly.
``treeguard verify`` (a ``Model``'s ``rtol``, ``atol`` and per-dtype
``tolerances``), ``treeguard diagnose`` and the ``tree_regression`` pytest
fixture all decide with it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigError
from .leaf import dtype_of, is_inexact, resolve_dtype


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """An explicit ``allclose`` tolerance: ``|actual - expected| <= atol + rtol * |expected|``.

    Example:
      >>> Tolerance(rtol=1e-5, atol=1e-6).describe()
      'rtol 1e-05, atol 1e-06'
    """

    rtol: float
    atol: float

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or v < 0
            ):
                raise ConfigError(f"tolerance {name} is {v!r}", hint="pass a finite number >= 0")

    def describe(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


#: ``torch.testing``'s defaults per dtype: (rtol, atol).
DTYPE_DEFAULTS: dict[str, Tolerance] = {
    "float16": Tolerance(1e-3, 1e-5),
    "bfloat16": Tolerance(1.6e-2, 1e-5),
    "float32": Tolerance(1.3e-6, 1e-5),
    "float64": Tolerance(1e-7, 1e-7),
}

EXACT = Tolerance(0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class TolerancePolicy:
    """How close a candidate's leaf must be to the reference's.

    Attributes:
      default: the tolerance of a float leaf with no rule of its own; None
        takes ``DTYPE_DEFAULTS`` for its dtype (float32's otherwise).
      dtypes: per-dtype tolerances, by name or short name (``"bf16"``).
      paths: ``(glob, Tolerance)`` rules over key paths in ``keystr`` form,
        first match wins: ``[("*['dense2']*", Tolerance(1e-4, 1e-5))]``. Only
        ``*`` (any text) and ``?`` (one character) are wildcards; brackets
        and quotes match themselves, as key paths are full of them.
      fp64: the multiplier ``m`` of the fp64-relative rule, or None.

    Example:
      >>> t = TolerancePolicy(dtypes={"bf16": Tolerance(1e-2, 1e-2)},
      ...                paths=[("*['b']", Tolerance(0.0, 0.5))])
      >>> t.for_leaf("['dense1']['b']", "float32"), t.for_leaf("['w']", "bfloat16")
      (Tolerance(rtol=0.0, atol=0.5), Tolerance(rtol=0.01, atol=0.01))
      >>> t.for_leaf("['step']", "int32")
      Tolerance(rtol=0.0, atol=0.0)
    """

    default: Tolerance | None = None
    dtypes: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)
    paths: Sequence[tuple[str, Tolerance]] = ()
    fp64: float | None = None

    def __post_init__(self) -> None:
        for k, v in self.dtypes.items():
            resolve_dtype(k)
            if not isinstance(v, Tolerance):
                raise ConfigError(
                    f"TolerancePolicy.dtypes[{k!r}] is {v!r}", hint="Tolerance(rtol, atol)"
                )
        for rule in self.paths:
            if (
                not isinstance(rule, tuple)
                or len(rule) != 2
                or not isinstance(rule[0], str)
                or not isinstance(rule[1], Tolerance)
            ):
                raise ConfigError(
                    f"TolerancePolicy.paths holds {rule!r}", hint="(glob, Tolerance(rtol, atol))"
                )
        if self.fp64 is not None and not (math.isfinite(self.fp64) and self.fp64 >= 1):
            raise ConfigError(
                f"TolerancePolicy.fp64 is {self.fp64!r}", hint="a multiplier >= 1, e.g. 2.0"
            )

    @staticmethod
    def of(
        *, rtol: float | None = None, atol: float | None = None, base: TolerancePolicy | None = None
    ) -> TolerancePolicy:
        """``base`` (or the defaults) with ``rtol``/``atol`` as the default when given."""
        t = base or TolerancePolicy()
        if rtol is None and atol is None:
            return t
        return dataclasses.replace(
            t,
            default=Tolerance(rtol if rtol is not None else 0.0, atol if atol is not None else 0.0),
        )

    def for_leaf(self, path: str, dtype: Any) -> Tolerance:
        """The tolerance of the leaf at ``path`` with ``dtype``."""
        dt = dtype_of(dtype)
        if not is_inexact(dt):
            return EXACT
        for glob, tol in self.paths:
            if glob_matches(glob, path):
                return tol
        for k, v in self.dtypes.items():
            if resolve_dtype(k) == dt:
                return v
        if self.default is not None:
            return self.default
        return DTYPE_DEFAULTS.get(dt.name, DTYPE_DEFAULTS["float32"])

    def to_dict(self) -> dict[str, Any]:
        def one(t: Tolerance) -> dict[str, float]:
            return {"rtol": t.rtol, "atol": t.atol}

        return {
            "default": one(self.default) if self.default is not None else "per dtype",
            "dtypes": {resolve_dtype(k).name: one(v) for k, v in self.dtypes.items()},
            "paths": [[g, one(t)] for g, t in self.paths],
            "fp64": self.fp64,
        }


@functools.lru_cache(maxsize=256)
def _glob_re(glob: str) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile("".join(parts), re.DOTALL)


def glob_matches(glob: str, path: str) -> bool:
    """Whether a key path matches a glob where only ``*`` and ``?`` are wildcards.

    Example:
      >>> glob_matches("*['b']", "['dense1']['b']"), glob_matches("*['b']", "['dense1']['w']")
      (True, False)
    """
    return _glob_re(glob).fullmatch(path) is not None
