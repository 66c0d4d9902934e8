"""What one leaf is, as the contracts and every message see it: its dtype
read from a name or a value, its summary ``f32[3,1]`` (never its values), and
the text form of its sharding.

Numpy alone: ``ml_dtypes`` is imported for a dtype numpy does not know by
name, and JAX only to read a live array's sharding.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any, TypeAlias

import numpy as np

from .errors import ConfigError, FormatError
from .keydtype import dtype_name, key_dtype_or_none

Dim: TypeAlias = int | str
Shape: TypeAlias = tuple[Dim, ...]
#: One leaf's contract in columnar form: shape, dtype, weak_type, sharding.
Record: TypeAlias = tuple[Shape, np.dtype[Any], bool | None, str | None]


def dtype_of(x: Any) -> np.dtype[Any]:
    """Reads a dtype from a name, a numpy dtype or a scalar type; ml_dtypes
    names such as ``"bfloat16"`` included.

    Raises:
      FormatError: for a name that is no dtype.

    Example:
      >>> dtype_of("bfloat16").name
      'bfloat16'
    """
    if x is None:
        raise FormatError("no dtype given")
    key = key_dtype_or_none(x)  # typed PRNG keys: ``key<fry>`` (see keydtype.py)
    if key is not None:
        return key
    try:
        dtype: np.dtype[Any] = x if isinstance(x, np.dtype) else _np_dtype(x)
    except (TypeError, ValueError) as e:
        raise FormatError(f"unknown dtype {x!r}") from e
    if not _is_array_dtype(dtype):
        raise FormatError(f"dtype {dtype.name!r} is not a numeric array dtype")
    return dtype


def _np_dtype(x: Any) -> np.dtype[Any]:
    """``np.dtype(x)``; a name numpy does not know is looked up again once
    ``ml_dtypes`` (whose import is costly) has registered its types."""
    try:
        known: np.dtype[Any] = np.dtype(x)
        return known
    except TypeError:
        if not isinstance(x, str):
            raise
    import ml_dtypes  # noqa: F401 - registers bfloat16, float8_*, int4... with numpy

    dtype: np.dtype[Any] = np.dtype(x)
    return dtype


def _is_array_dtype(dtype: np.dtype[Any]) -> bool:
    """Numbers and bools, and the ml_dtypes extensions (bfloat16, float8, int4...)."""
    return dtype.kind in "biufc" or (
        dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes")
    )


def is_inexact(dtype: Any) -> bool:
    """Whether a dtype can hold NaN or Inf: every float kind and complex.

    float16/32/64, complex, ``bfloat16`` and every float8 (and float4/6) of
    ``ml_dtypes``: their dtype kind is ``'V'`` (one, ``float8_e5m2``, is
    ``'f'``), so a test of ``dtype.kind in "fc"`` misses them. This is the one
    place that tells a float dtype from the others.

    Args:
      dtype: a numpy dtype, a scalar type or a dtype name.

    Returns:
      True for a floating or complex dtype; False for bool, integers
      (``int4`` included) and typed PRNG keys.

    Raises:
      FormatError: for a name that is no dtype.

    Example:
      >>> [is_inexact(n) for n in ("bfloat16", "float8_e4m3fn", "complex64", "int4", "bool")]
      [True, True, True, False, False]
    """
    try:
        dt = dtype if isinstance(dtype, np.dtype) else dtype_of(dtype)
    except TypeError:  # a JAX key dtype of a custom implementation: no floats
        return False
    return dt.kind in "fc" or (dt.kind == "V" and _ml_float(dt))


@functools.lru_cache(maxsize=64)
def _ml_float(dt: np.dtype[Any]) -> bool:
    """Whether a dtype of kind ``'V'`` is one of ml_dtypes' floats (per dtype, once)."""
    return dt.type.__module__.startswith("ml_dtypes") and "float" in dt.name


def short_dtype(dtype: np.dtype[Any]) -> str:
    """The short name used in summaries: ``f32``, ``bf16``, ``i8``, ``bool``.

    Example:
      >>> short_dtype(np.dtype("float32")), short_dtype(dtype_of("bfloat16"))
      ('f32', 'bf16')
    """
    name = dtype_name(dtype)
    if name == "bool":
        return "bool"
    if name == "bfloat16":
        return "bf16"
    for prefix, short in (("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c")):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return short + name[len(prefix) :]
    return name


def summarize(shape: Shape, dtype: np.dtype[Any]) -> str:
    """An array as ``f32[3,1]``, never its values.

    Example:
      >>> summarize(("B", 2), np.dtype("int8"))
      'i8[B,2]'
    """
    return f"{short_dtype(dtype)}[{','.join(str(d) for d in shape)}]"


def _trimmed(spec: tuple[Any, ...]) -> tuple[Any, ...]:
    end = len(spec)
    while end and spec[end - 1] is None:
        end -= 1
    return spec[:end]


#: Longer sharding texts (from a hostile file) are compared as written.
_MAX_SPEC_TEXT = 4096
_SPEC_TEXT = re.compile(r"^(named\(mesh\[[^\]]*\], spec)(\(.*\))\)$")


def same_sharding(a: str, b: str) -> bool:
    """Whether two ``describe_sharding`` texts name one sharding, reading a
    text written before trailing unsharded dimensions were left out
    (``spec('x', None)``) as today's (``spec('x',)``).

    Example:
      >>> same_sharding("named(mesh[x=2], spec('x', None))", "named(mesh[x=2], spec('x',))")
      True
      >>> same_sharding("named(mesh[x=2], spec('x',))", "named(mesh[x=2:Explicit], spec('x',))")
      False
    """
    return a == b or _canonical(a) == _canonical(b)


def _canonical(text: str) -> str:
    m = _SPEC_TEXT.match(text) if len(text) <= _MAX_SPEC_TEXT else None
    if m is None:
        return text
    try:
        spec = ast.literal_eval(m.group(2))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if not isinstance(spec, tuple):
        return text
    return f"{m.group(1)}{_trimmed(spec)})"


def describe_sharding(x: Any) -> str | None:
    """A stable text form of an array's sharding, or None for no array.

    A named sharding is written with its mesh axes and partition spec; a
    single-device one as ``single``. Device ids are left out, so a spec
    carries over to another host with the same mesh. A mesh with an axis
    that is not Auto writes each axis's type (``mesh[x=2:Explicit,y=4:Auto]``);
    an all-Auto mesh is written as before axis types existed. Trailing
    unsharded dimensions are left out of the spec (``P('x', None)`` reads
    ``spec('x',)``), as JAX treats them.
    """
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return None
    import jax  # lazy: reading files never imports jax

    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(sharding, jax.sharding.NamedSharding):
        sizes = sharding.mesh.shape.items()
        types = [t.name for t in getattr(sharding.mesh, "axis_types", ())]
        if all(t == "Auto" for t in types):
            mesh = ",".join(f"{n}={s}" for n, s in sizes)
        else:
            mesh = ",".join(f"{n}={s}:{t}" for (n, s), t in zip(sizes, types))
        return f"named(mesh[{mesh}], spec{_trimmed(tuple(sharding.spec))})"
    # jax 0.12.1 deprecates the class's name for its predicate
    probe = getattr(jax.sharding, "is_single_device_sharding", None)
    if (
        probe(sharding)
        if probe is not None
        else isinstance(sharding, jax.sharding.SingleDeviceSharding)
    ):
        return "single"
    return f"{type(sharding).__name__}({len(sharding.device_set)} devices)"


_NAMED = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)


def resolve_dtype(name: Any) -> np.dtype[Any]:
    """A dtype from its name or its short name (``"bf16"``, ``"f32"``).

    Raises:
      ConfigError: for a name that is no dtype.

    Example:
      >>> resolve_dtype("bf16").name, resolve_dtype("float32").name
      ('bfloat16', 'float32')
    """
    try:
        return dtype_of(name)
    except (TypeError, ValueError):
        for n in _NAMED:
            dt = dtype_of(n)
            if short_dtype(dt) == name:
                return dt
    raise ConfigError(f"unknown dtype {name!r}", hint="a name such as 'bfloat16' or 'bf16'")
