"""What a checked step is asked to do: the dtype policy, what to do with NaN
and Inf, donation, and the record of a cast done on purpose."""

from __future__ import annotations

import dataclasses
from typing import Literal, TypeAlias

DtypePolicy: TypeAlias = Literal["strict", "cast"]
OnNonfinite: TypeAlias = Literal["raise", "skip", "ignore"]

_DTYPE_POLICIES = ("strict", "cast")
_ON_NONFINITE = ("raise", "skip", "ignore")

TRACED_RAISE = (
    'on_nonfinite="raise" needs concrete values, but the step was called inside a JAX '
    'transformation; hint: pass on_nonfinite="skip" (keeps the old values, traceable) or '
    '"ignore", or call the step outside jit'
)


def check_options(dtype_policy: str, on_nonfinite: str) -> None:
    """Refuses an unknown ``dtype_policy`` or ``on_nonfinite``.

    Raises:
      ValueError: naming the allowed values.
    """
    if dtype_policy not in _DTYPE_POLICIES:
        raise ValueError(f"dtype_policy must be one of {_DTYPE_POLICIES}, not {dtype_policy!r}")
    if on_nonfinite not in _ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {_ON_NONFINITE}, not {on_nonfinite!r}")


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """The options every checked step takes, validated once.

    Attributes:
      dtype_policy: ``"strict"`` refuses a dtype that differs from the
        param's; ``"cast"`` casts it on purpose (never to another kind).
      donate: whether the step donates the buffers it replaces.
      on_nonfinite: ``"raise"``, ``"skip"`` or ``"ignore"``.
    """

    dtype_policy: DtypePolicy
    donate: bool
    on_nonfinite: OnNonfinite

    def __post_init__(self) -> None:
        check_options(self.dtype_policy, self.on_nonfinite)
        object.__setattr__(self, "donate", bool(self.donate))


@dataclasses.dataclass(frozen=True)
class Cast:
    """One cast done on purpose under ``dtype_policy="cast"``.

    Attributes:
      path: the leaf's key path in ``keystr`` form.
      source: the dtype name it had.
      target: the dtype name it was cast to (always its param's dtype).
      where: what was cast, e.g. ``"the updates"`` or ``"fn's result"``.

    Example:
      >>> Cast("['w']", "float32", "bfloat16", "the updates").describe()
      "['w']: float32 -> bfloat16 in the updates"
    """

    path: str
    source: str
    target: str
    where: str

    def describe(self) -> str:
        """One line: ``['w']: float32 -> bfloat16 in the updates``."""
        return f"{self.path or '<root>'}: {self.source} -> {self.target} in {self.where}"
