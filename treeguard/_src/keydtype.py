"""Typed PRNG key arrays in a contract: a numpy dtype for ``key<fry>`` and its kin.

JAX's typed keys (``jax.random.key(0)``, dtype ``key<fry>``) have no numpy
dtype, so a contract holds each known implementation as a structured numpy
dtype with one field, named for the JAX dtype, of the key's raw ``uint32``
data: ``key<fry>`` is ``[('key<fry>', '<u4', (2,))]``. Its ``itemsize`` is the
key data's size, so sizes and byte counts come out right; it equals no other
dtype (neither ``uint32`` nor another implementation's), so a typed key
against raw key data, or threefry against rbg, is a dtype mismatch. Its
text form everywhere (summaries, spec JSON, messages) is the JAX name,
``key<fry>``. A name of no known implementation is a ``FormatError``.

JAX itself is imported only where keys are wrapped or unwrapped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import FormatError

#: The tag in JAX's dtype name -> (the implementation's name, its key data shape).
IMPLS: dict[str, tuple[str, tuple[int, ...]]] = {
    "fry": ("threefry2x32", (2,)),
    "rbg": ("rbg", (4,)),
    "urbg": ("unsafe_rbg", (4,)),
}

KEY_DTYPES: dict[str, np.dtype[Any]] = {
    f"key<{tag}>": np.dtype([(f"key<{tag}>", "<u4", shape)]) for tag, (_, shape) in IMPLS.items()
}
_NAMES: dict[np.dtype[Any], str] = {d: n for n, d in KEY_DTYPES.items()}


def is_key_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is the contract dtype of a typed PRNG key."""
    return isinstance(dtype, np.dtype) and dtype.names is not None and dtype in _NAMES


def dtype_name(dtype: np.dtype[Any]) -> str:
    """A dtype's name: ``float32``, ``bfloat16``, ``key<fry>``.

    Example:
      >>> dtype_name(np.dtype("float32")), dtype_name(key_dtype("key<fry>"))
      ('float32', 'key<fry>')
    """
    if dtype.names is not None:
        name = _NAMES.get(dtype)
        if name is not None:
            return name
    return dtype.name


def key_dtype(name: str) -> np.dtype[Any]:
    """The contract dtype for JAX's key dtype name.

    Raises:
      FormatError: for a name of no known implementation.

    Example:
      >>> key_dtype("key<rbg>").itemsize
      16
    """
    found = KEY_DTYPES.get(name)
    if found is None:
        known = ", ".join(f"{n} ({IMPLS[n[4:-1]][0]})" for n in KEY_DTYPES)
        raise FormatError(
            f"unknown PRNG key implementation {name[:40]!r}; treeguard knows {known}",
            hint="save keys of a custom implementation as raw data (jax.random.key_data)",
        )
    return found


def key_dtype_or_none(x: Any) -> np.dtype[Any] | None:
    """The contract dtype if ``x`` names or is a typed key dtype, else None.

    Raises:
      FormatError: for a ``key<...>`` name (read from a file or spec) of no
        known implementation.
      TypeError: for a JAX key dtype of a custom implementation.
    """
    if isinstance(x, np.dtype):
        return x if is_key_dtype(x) else None
    if isinstance(x, str):
        return key_dtype(x) if x.startswith("key<") else None
    name = getattr(x, "name", None)
    if isinstance(name, str) and name.startswith("key<") and _is_jax_key(x):
        if name not in KEY_DTYPES:  # a live key of a custom implementation
            raise TypeError(
                f"typed PRNG keys of dtype {name[:40]} (a custom implementation) have no "
                "contract dtype; use jax.random.key_data(key) for their raw data"
            )
        return KEY_DTYPES[name]
    return None


def _is_jax_key(x: Any) -> bool:
    return type(x).__name__ == "KeyTy" or "prng" in type(x).__module__


def array_dtype(x: Any) -> np.dtype[Any]:
    """``np.dtype(x)``, also for JAX's typed key dtypes.

    Raises:
      TypeError: for anything that is no dtype.
      FormatError: for a key dtype of an implementation treeguard does not know.
    """
    if isinstance(x, np.dtype):
        return x
    try:
        out: np.dtype[Any] = np.dtype(x)
        return out
    except TypeError:
        found = key_dtype_or_none(x)
        if found is None:
            raise
        return found


def impl_of(dtype: np.dtype[Any]) -> tuple[str, tuple[int, ...]]:
    """The implementation name and key data shape of a key contract dtype."""
    return IMPLS[dtype_name(dtype)[4:-1]]


def key_data(x: Any, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A typed key array's raw data, viewed as its contract dtype (shape unchanged)."""
    import jax  # lazy: reading files never imports jax

    data = np.ascontiguousarray(np.asarray(jax.random.key_data(x)), dtype=np.dtype("<u4"))
    return data.reshape(-1).view(dtype).reshape(tuple(x.shape))


def wrap_keys(arr: np.ndarray[Any, Any]) -> Any:
    """A typed key array (``jax.random.wrap_key_data``) from loaded key data."""
    import jax  # lazy: reading files never imports jax

    impl, key_shape = impl_of(arr.dtype)
    data = np.ascontiguousarray(arr).reshape(-1).view(np.dtype("<u4"))
    return jax.random.wrap_key_data(
        jax.numpy.asarray(data.reshape(*arr.shape, *key_shape)), impl=impl
    )
