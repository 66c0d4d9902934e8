"""Numeric comparison of two trees leaf by leaf, at explicit per-dtype tolerances."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..diff import mismatches
from ..leaf import summarize
from ..mismatch import Mismatch
from ..paths import Path as PathT
from ..paths import keystr
from ..spec import TreeSpec
from ..tolerance import Tolerance, TolerancePolicy
from ..walk import flatten, structure_of


@dataclasses.dataclass(frozen=True)
class LeafError:
    """How far one leaf is from its reference.

    Attributes:
      path: the key path.
      summary: the reference leaf as ``f32[8,1]``.
      max_abs: the largest ``|actual - expected|`` (0 when equal; inf for a
        non-finite value where the reference has another).
      max_rel: the largest ``|actual - expected| / |expected|`` over non-zero
        references.
      ratio: the largest ``|actual - expected| / (atol + rtol * |expected|)``;
        the leaf is within tolerance when it is at most 1.
      tolerance: the tolerance used.
      bad: how many elements are beyond tolerance.
      size: how many elements the leaf has.
    """

    path: str
    summary: str
    max_abs: float
    max_rel: float
    ratio: float
    tolerance: Tolerance
    bad: int
    size: int

    @property
    def ok(self) -> bool:
        return self.bad == 0

    def describe(self) -> str:
        """One line for a report.

        Example:
          >>> print(LeafError("['w']", "f32[2]", 0.5, 0.25, 5e4, Tolerance(1e-5, 1e-5), 2, 2)
          ...       .describe())
          ['w'] f32[2]: 2 of 2 elements beyond tolerance, max abs err 0.5, max rel err 0.25
          (rtol 1e-05, atol 1e-05)
        """
        where = self.path or "<root>"
        head = (
            f"{self.bad} of {self.size} elements beyond tolerance"
            if self.bad
            else "within tolerance"
        )
        return (
            f"{where} {self.summary}: {head}, max abs err {self.max_abs:.3g}, "
            f"max rel err {self.max_rel:.3g} ({self.tolerance.describe()})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "summary": self.summary,
            "max_abs": _json_float(self.max_abs),
            "max_rel": _json_float(self.max_rel),
            "ratio": _json_float(self.ratio),
            "rtol": self.tolerance.rtol,
            "atol": self.tolerance.atol,
            "bad": self.bad,
            "size": self.size,
            "ok": self.ok,
        }


def _json_float(x: float) -> float | str:
    return x if np.isfinite(x) else ("inf" if x > 0 else "nan")


def as_float64(x: Any) -> np.ndarray[Any, Any]:
    """A real leaf as a float64 numpy array (bf16 and ints included).

    Example:
      >>> as_float64(np.int8([1, -2])).dtype.name
      'float64'
    """
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":  # bfloat16 and the other ml_dtypes
        a = a.astype(np.float32)
    return np.asarray(a, dtype=np.float64)


def _as_numbers(actual: Any, expected: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Both leaves in one exact numeric type: complex128 when either is
    complex (so the imaginary parts are compared too), else float64."""
    a_raw, e_raw = np.asarray(actual), np.asarray(expected)
    if a_raw.dtype.kind == "c" or e_raw.dtype.kind == "c":
        return np.asarray(a_raw, np.complex128), np.asarray(e_raw, np.complex128)
    return as_float64(a_raw), as_float64(e_raw)


def leaf_error(actual: Any, expected: Any, tol: Tolerance, *, path: str = "") -> LeafError:
    """Compares one leaf with its reference, elementwise, as ``allclose`` does.

    NaN equals NaN and an infinity equals the same infinity: whether a value
    should be finite is the ``finite`` check's question, not this one's.
    Complex leaves are compared as complex numbers: the error is the modulus
    of the difference, so the imaginary parts count as much as the real ones.

    Example:
      >>> leaf_error(np.float32([1.0, 2.0]), np.float32([1.0, 2.1]), Tolerance(0.0, 0.01)).bad
      1
      >>> leaf_error(np.complex64([1 + 1j]), np.complex64([1 + 5j]), Tolerance(0.0, 0.01)).max_abs
      4.0
    """
    e_raw = np.asarray(expected)
    a, e = _as_numbers(actual, expected)
    summary = summarize(tuple(e_raw.shape), e_raw.dtype)
    if a.shape != e.shape:
        return LeafError(
            path, summary, float("inf"), float("inf"), float("inf"), tol, e.size, e.size
        )
    same_special = (np.isnan(a) & np.isnan(e)) | (np.isinf(a) & (a == e))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.where(same_special, 0.0, np.abs(a - e))
        diff = np.where(np.isnan(diff), np.inf, diff)
        allowed = tol.atol + tol.rtol * np.abs(np.where(np.isfinite(e), e, 0.0))
        ratio = np.where(diff == 0, 0.0, np.where(allowed > 0, diff / allowed, np.inf))
        rel = np.where((e != 0) & np.isfinite(e), diff / np.abs(np.where(e == 0, 1.0, e)), 0.0)
    bad = int(np.count_nonzero(diff > allowed))
    return LeafError(
        path,
        summary,
        float(diff.max()) if diff.size else 0.0,
        float(rel.max()) if rel.size else 0.0,
        float(ratio.max()) if ratio.size else 0.0,
        tol,
        bad,
        int(e.size),
    )


def _tolerance_of(
    tolerance: TolerancePolicy | Callable[[Any], Tolerance], path: str, reference: Any
) -> Tolerance:
    dtype = np.asarray(reference).dtype
    if isinstance(tolerance, TolerancePolicy):
        return tolerance.for_leaf(path, dtype)
    return tolerance(dtype)


def compare_trees(
    actual: Any,
    expected: Any,
    /,
    *,
    tolerance: TolerancePolicy | Callable[[Any], Tolerance],
) -> tuple[list[Mismatch], list[LeafError]]:
    """Compares two trees: their structures first, then every leaf's values.

    Args:
      actual: the tree under test.
      expected: the reference tree.
      tolerance: the ``TolerancePolicy`` (by key path and dtype), or a
        function from a leaf's dtype (the reference's) to its ``Tolerance``.

    Returns:
      The structural mismatches (empty when the structures agree), and one
      ``LeafError`` per reference leaf, matched by key path, for the leaves
      present in both with the same shape.

    Example:
      >>> policy = TolerancePolicy(default=Tolerance(0.0, 0.5))
      >>> found, errs = compare_trees({"w": np.ones(2)}, {"w": np.zeros(2)}, tolerance=policy)
      >>> found
      []
      >>> print(errs[0].describe())
      ['w'] f64[2]: 2 of 2 elements beyond tolerance, max abs err 1, max rel err 0
      (rtol 0, atol 0.5)
    """
    found = mismatches(actual, expected)
    a_items = dict(leaves_with_paths(actual))
    out: list[LeafError] = []
    bad_paths = {m.path for m in found if m.kind in ("shape", "missing", "unexpected", "node_type")}
    for path, e in leaves_with_paths(expected):
        if path not in a_items or path in bad_paths:
            continue
        out.append(leaf_error(a_items[path], e, _tolerance_of(tolerance, path, e), path=path))
    return found, out


def compare_stored(
    actual: Any,
    stored: Any,
    /,
    *,
    spec: TreeSpec,
    tolerance: TolerancePolicy | Callable[[Any], Tolerance],
) -> tuple[list[Mismatch], list[LeafError]]:
    """Compares a tree with one read back from a file without ``like``.

    A file read without ``like`` rebuilds namedtuples and registered classes
    (flax structs, equinox modules) as dicts keyed by field name, since a
    class named in a file is never imported. So the structure is compared
    with the file's stored spec, which keeps the class names, and the values
    leaf by leaf along each leaf's key path: ``.w`` in the tree is ``['w']``
    in the read-back dict. Weak types are ignored, as every checkpoint
    contract ignores them: no file keeps one.

    Args:
      actual: the tree under test (custom nodes included).
      stored: the tree read back with ``checkpoint.load(path)``.
      spec: the stored spec of the same tree (``checkpoint.read_header(path).spec``,
        or the part of it for ``stored``).
      tolerance: the ``TolerancePolicy`` (by key path and dtype), or a
        function from a leaf's dtype (the stored one's) to its ``Tolerance``.

    Returns:
      The structural mismatches (empty when the structures agree), and one
      ``LeafError`` per leaf of ``actual`` that ``stored`` holds at the same
      key path with the same shape, in ``actual``'s flatten order.

    Raises:
      InvalidTreeError: for a cyclic tree.

    Example:
      >>> import collections, jax
      >>> from treeguard import spec_of
      >>> Dense = collections.namedtuple("Dense", "w b")
      >>> params = Dense(np.ones(2), np.zeros(1))
      >>> read_back = {"w": np.float64([1.0, 3.0]), "b": np.zeros(1)}  # how a file gives it
      >>> found, errs = compare_stored(params, read_back, spec=spec_of(params),
      ...                              tolerance=lambda d: Tolerance(0.0, 0.5))
      >>> found, [e.path for e in errs], errs[0].bad
      ([], ['.w', '.b'], 1)
    """
    found = [m for m in mismatches(actual, spec) if m.kind != "weak_type"]
    bad_paths = {m.path for m in found if m.kind in ("shape", "missing", "unexpected")}
    out: list[LeafError] = []
    for entries, leaf in _entries_and_leaves(actual):
        path = keystr(entries)
        want = _at(stored, entries)
        if want is _ABSENT or path in bad_paths or np.shape(want) != np.shape(leaf):
            continue
        out.append(leaf_error(leaf, want, _tolerance_of(tolerance, path, want), path=path))
    return found, out


_ABSENT = object()


def _at(stored: Any, entries: PathT) -> Any:
    """The leaf of a read-back tree at ``entries``, or ``_ABSENT``.

    Every entry kind is the same lookup there: a dict key, a sequence
    index, or the field name or index a custom node's dict is keyed by.
    """
    node = stored
    for _, key in entries:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return _ABSENT
    if isinstance(node, (dict, list, tuple)) or node is None:
        return _ABSENT
    return node


def leaves_with_paths(tree: Any) -> list[tuple[str, Any]]:
    """Every leaf with its key path in ``keystr`` form, in flatten order.

    Raises:
      InvalidTreeError: for a cyclic tree.

    Example:
      >>> leaves_with_paths({"b": np.zeros(1), "a": [np.ones(2)]})[0][0]
      "['a'][0]"
    """
    return [(keystr(p), x) for p, x in _entries_and_leaves(tree)]


def _entries_and_leaves(tree: Any) -> list[tuple[PathT, Any]]:
    leaves, treedef = flatten(tree)  # refuses a cyclic tree with its path
    return list(zip(structure_of(tree, treedef).leaf_paths(), leaves))
