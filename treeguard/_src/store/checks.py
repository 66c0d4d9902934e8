"""Running the caller's checks in ``verify``: each passes, fails, or raises."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..leaf import summarize
from .records import CheckRecord

#: A check run by ``verify``: a callable taking the loaded tree, or a
#: ``(name, callable)`` pair. It passes by returning None or any true value
#: (``True``, ``np.True_``, a true 0-d jax array) and fails by returning a
#: false one (``False``, ``np.False_``, ``0``) or raising; an array of another
#: shape is no truth value and fails too.
Check = Callable[[Any], object] | tuple[str, Callable[[Any], object]]


def run_checks(tree: Any, checks: Sequence[Check]) -> tuple[list[CheckRecord], str | None]:
    """Runs checks in order up to the first failure.

    Returns:
      The results, and the reason of the first failure (None if all pass).
    """
    results: list[CheckRecord] = []
    for i, check in enumerate(checks):
        name, fn = check if isinstance(check, tuple) else (_name(check, i), check)
        try:
            ok = fn(tree)
        except Exception as e:  # noqa: BLE001 - a check's failure is data here
            results.append(CheckRecord(name, False, f"{type(e).__name__}: {e}"))
            return results, f"check {name} raised {type(e).__name__}: {e}"
        failure = _failure(ok)
        if failure is not None:
            results.append(CheckRecord(name, False, failure))
            return results, f"check {name} {failure}"
        results.append(CheckRecord(name, True))
    return results, None


def _failure(ok: object) -> str | None:
    """Why a check's result fails it, or None if it passes."""
    if ok is None:
        return None
    shape = getattr(ok, "shape", None)
    if shape is not None and tuple(shape) != ():
        try:
            what = summarize(tuple(shape), np.dtype(getattr(ok, "dtype", None)))
        except TypeError:
            what = f"an array of shape {tuple(shape)}"
        return f"returned {what}, not a truth value; reduce it, e.g. with .all()"
    try:
        passed = bool(ok)
    except Exception as e:  # noqa: BLE001 - an object with no truth value fails the check
        return f"returned a {type(ok).__name__} with no truth value ({type(e).__name__}: {e})"
    if passed:
        return None
    item = getattr(ok, "item", None)
    value = item() if shape is not None and callable(item) else ok
    return f"returned {value!r}"[:200]


def _name(fn: Callable[[Any], object], index: int) -> str:
    name = getattr(fn, "__name__", "")
    return f"check[{index}]" if not name or name == "<lambda>" else name
