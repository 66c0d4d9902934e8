"""LeafSpec, the contract record of one leaf value, and the signature of a
list of leaves (what ``TreeSpec``'s validated-signature cache compares).

Reading a record needs numpy only; JAX is imported by the functions that
meet live arrays.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from .acyclic import known_leaf_types
from .keydtype import array_dtype
from .leaf import Record, Shape, describe_sharding, dtype_of, summarize

_aval = attrgetter("aval")
_shape = attrgetter("shape")
_dtype = attrgetter("dtype")


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """The contract of one leaf: shape, dtype, weak type and sharding.

    A LeafSpec can stand as a leaf of a hand-written template that
    ``spec_of`` reads, so a contract can be written without arrays.

    Attributes:
      shape: a tuple of ints and symbols; ``("B", 2)`` has a symbolic batch axis.
      dtype: the dtype; a name such as ``"bfloat16"`` is accepted.
      weak_type: JAX's weak-type flag, or None to accept either.
      sharding: a ``describe_sharding`` text, or None to accept any.
      path: the key path in ``keystr`` form; filled in by ``TreeSpec.leaves``.

    Example:
      >>> LeafSpec(("B", 2), "float32").summary()
      'f32[B,2]'
    """

    shape: Shape
    dtype: Any
    weak_type: bool | None = None
    sharding: str | None = None
    path: str = ""

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        for d in shape:
            if (
                isinstance(d, bool)
                or not isinstance(d, (int, str))
                or (isinstance(d, int) and d < 0)
            ):
                raise ValueError(
                    f"{self.path or 'leaf'}: dimension {d!r} is neither a size nor a symbol"
                )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype_of(self.dtype))

    def summary(self) -> str:
        """``f32[3,1]``."""
        return summarize(self.shape, self.dtype)

    @property
    def size(self) -> int | None:
        """The element count, or None when a dimension is symbolic."""
        if any(isinstance(d, str) for d in self.shape):
            return None
        return math.prod(int(d) for d in self.shape)

    def record(self) -> Record:
        return (self.shape, self.dtype, self.weak_type, self.sharding)


def _scalar_record(x: Any) -> Record:
    import jax  # lazy: reading files never imports jax

    if isinstance(x, bool):
        return ((), np.dtype(bool), False, None)
    if isinstance(x, int):
        return ((), np.dtype(jax.dtypes.canonicalize_dtype(np.int64)), True, None)
    if isinstance(x, float):
        return ((), np.dtype(jax.dtypes.canonicalize_dtype(np.float64)), True, None)
    return ((), np.dtype(jax.dtypes.canonicalize_dtype(np.complex128)), True, None)


def record_of(x: Any, with_sharding: bool = False) -> Record:
    """The contract record of one leaf value.

    Raises:
      TypeError: if ``x`` is not an array-like leaf.
    """
    if isinstance(x, LeafSpec):
        return x.record()
    if isinstance(x, (np.ndarray, np.generic)):
        return (tuple(x.shape), x.dtype, False, None)
    sharding = describe_sharding(x) if with_sharding else None
    aval = getattr(x, "aval", None)
    if aval is not None and hasattr(aval, "shape"):
        return (tuple(aval.shape), array_dtype(aval.dtype), bool(aval.weak_type), sharding)
    import jax  # lazy: reading files never imports jax

    if isinstance(x, jax.ShapeDtypeStruct):
        return (tuple(x.shape), array_dtype(x.dtype), bool(x.weak_type), sharding)
    if isinstance(x, (bool, int, float, complex)):
        return _scalar_record(x)
    raise TypeError(f"leaf of type {type(x).__name__} is not an array")


def signature_in(leaves: Sequence[Any], seen: list[Any]) -> bool:
    """Whether the leaves' ``leaf_signature`` is one of ``seen``."""
    # A numpy signature makes a new tuple per leaf (``.shape``): on a large
    # tree the collector would scan them at about a third of the check's
    # cost, though they hold no cycle and die here. It is paused until they
    # are freed, so it has nothing of theirs left to scan.
    enabled = gc.isenabled()
    gc.disable()
    try:
        sig = leaf_signature(leaves)
        # Tuple equality short-cuts on identical (interned) avals and
        # dtypes, so this is far cheaper than hashing the signature.
        found = sig is not None and any(sig == s for s in seen)
        del sig
        return found
    finally:
        if enabled:
            gc.enable()


def leaf_signature(leaves: Sequence[Any]) -> Any:
    """A signature of the leaves' types, shapes, dtypes and weak types, or
    None when some value is not a leaf of a parameter tree.

    JAX interns abstract values, so for jax arrays this is a tuple of
    ``aval``s built and compared at C speed. For numpy arrays (never weakly
    typed) it is their shapes and dtypes, read with ``map`` at C speed;
    other leaves fall back to one record each.
    """
    try:
        avals = tuple(map(_aval, leaves))
    except AttributeError:
        pass
    else:
        return ("aval", avals) if known_leaf_types(leaves) else None
    types = tuple(map(type, leaves))
    if types.count(np.ndarray) == len(types):
        return ("numpy", tuple(map(_shape, leaves)), tuple(map(_dtype, leaves)))
    if not known_leaf_types(leaves):
        return None
    try:
        return ("plain", tuple(map(_plain_sig, leaves)))
    except TypeError:
        return None


def _plain_sig(x: Any) -> Any:
    aval = getattr(x, "aval", None)
    if aval is not None:
        return aval
    return (type(x), *record_of(x))
