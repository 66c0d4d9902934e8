"""One difference between two pytrees, and how a list of them reads."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Literal, TypeAlias

MismatchKind: TypeAlias = Literal[
    "missing",
    "unexpected",
    "node_type",
    "node_data",
    "shape",
    "dtype",
    "weak_type",
    "sharding",
    "dim",
]

#: How many mismatches a message lists before it says how many it left out.
MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One difference, at one key path.

    Attributes:
      path: the key path in JAX's ``keystr`` form, ``"['dense2']['w']"``.
      kind: what differs: ``missing`` (in the expected tree only),
        ``unexpected`` (in the actual tree only), ``node_type``,
        ``node_data``, ``shape``, ``dtype``, ``weak_type``, ``sharding`` or
        ``dim`` (a symbolic dimension bound to two sizes).
      expected: the expected side, as a short value: a shape tuple, a dtype
        name, a type name or a summary such as ``"f32[3,1]"``.
      actual: the actual side, in the same form.

    Example:
      >>> Mismatch("['b']", "shape", (3,), (2, 3)).describe()
      "['b']: shape (3,) in the expected, (2, 3) in the actual"
    """

    path: str
    kind: MismatchKind
    expected: object
    actual: object

    def describe(self, expected_from: str = "the expected", actual_from: str = "the actual") -> str:
        """Renders the mismatch as one line of an error message.

        Args:
          expected_from: where the expected side came from, e.g. ``"the spec"``.
          actual_from: where the actual side came from, e.g. ``"the checkpoint"``.

        Returns:
          The line, starting with the path.
        """
        where = self.path or "<root>"
        e, a = self.expected, self.actual
        if self.kind == "missing":
            return f"{where}: missing: {e} in {expected_from}, absent in {actual_from}"
        if self.kind == "unexpected":
            return f"{where}: unexpected: {a} in {actual_from}, absent in {expected_from}"
        if self.kind == "dim":
            return f"{where}: dim {e} in {expected_from}, {a} in {actual_from}"
        label = self.kind.replace("_", " ")
        return f"{where}: {label} {e} in {expected_from}, {a} in {actual_from}"


def format_mismatches(
    found: Sequence[Mismatch],
    *,
    expected_from: str = "the expected",
    actual_from: str = "the actual",
    limit: int = MAX_LISTED,
    hint: str | None = None,
) -> str:
    """Renders mismatches as an error message: a head line, one line each, a hint.

    Args:
      found: the mismatches, in report order.
      expected_from: where the expected side came from.
      actual_from: where the actual side came from.
      limit: how many to list before the rest are counted.
      hint: the last line's fix; by default the one ``hint_for`` guesses.

    Returns:
      The message text.

    Example:
      >>> print(format_mismatches([Mismatch("['dense_2']", "unexpected", None, "dict"),
      ...     Mismatch("['dense2']", "missing", "dict", None)]))
      2 mismatches between the actual and the expected:
        ['dense_2']: unexpected: dict in the actual, absent in the expected
        ['dense2']: missing: dict in the expected, absent in the actual
      hint: `['dense_2']` in the actual: did you mean `['dense2']`?
    """
    n = len(found)
    noun = "mismatch" if n == 1 else "mismatches"
    lines = [f"{n} {noun} between {actual_from} and {expected_from}:"]
    lines += ["  " + m.describe(expected_from, actual_from) for m in found[:limit]]
    if n > limit:
        lines.append(f"  ... and {n - limit} more")
    hint = hint or hint_for(found, expected_from=expected_from, actual_from=actual_from)
    if hint:
        lines.append(f"hint: {hint}")
    return "\n".join(lines)


def hint_for(
    found: Sequence[Mismatch],
    *,
    expected_from: str = "the expected",
    actual_from: str = "the actual",
) -> str | None:
    """Guesses the likely fix for a list of mismatches.

    A custom node of another class (the same fields under a new name or
    module) is a renamed or moved class; a missing path next to an
    unexpected one that reads almost the same is probably a rename; a dtype
    mismatch is probably a forgotten cast; a shape mismatch is probably a
    transposed or broadcast array.

    Returns:
      The hint text, or None when nothing useful can be said.
    """
    for m in found:
        if m.kind == "node_type" and _is_class_name(m.expected) and _is_class_name(m.actual):
            return (
                f"{m.path or '<root>'} is class `{m.expected}` in {expected_from} and "
                f"`{m.actual}` in {actual_from}: the class was renamed or moved (its module "
                "and qualified name are part of the contract). To load the arrays anyway, "
                "load without `like=` (they come back as dicts by key path) and build the new "
                "class from them, or give the class its old name and module again"
            )
    nones = [m for m in found if m.kind == "node_type" and "none" in (m.expected, m.actual)]
    if nones and len(nones) == len(found):
        m = nones[0]
        side, other = (
            (expected_from, actual_from) if m.expected == "none" else (actual_from, expected_from)
        )
        return (
            f"{side} holds None where {other} holds arrays: a filter dropped them "
            "(eqx.filter(eqx.filter_eval_shape(...), eqx.is_array) keeps no "
            "jax.ShapeDtypeStruct, so every leaf becomes None); keep the shapes with "
            "eqx.filter(shapes, lambda x: isinstance(x, jax.ShapeDtypeStruct)), or pass the "
            "unfiltered tree"
        )
    missing = [m.path for m in found if m.kind == "missing"]
    renames = []
    for m in found:
        if m.kind != "unexpected":
            continue
        close = difflib.get_close_matches(m.path, missing, n=1, cutoff=0.6)
        if close:
            renames.append(f"`{m.path}` in {actual_from}: did you mean `{close[0]}`?")
    if renames:
        return " ".join(renames[:3])
    kinds = {m.kind for m in found}
    if any(m.kind == "dtype" and "key<" in f"{m.expected} {m.actual}" for m in found):
        return (
            "typed PRNG keys (key<fry>...) and raw key data (uint32, one more axis) differ: "
            "wrap raw data with jax.random.wrap_key_data(data, impl=...), or unwrap typed "
            "keys with jax.random.key_data(key), where the tree is built"
        )
    if "dtype" in kinds:
        return "cast on purpose before comparing, or fix the dtype where the tree is built"
    if "shape" in kinds:
        return (
            "an array of another shape would be broadcast or mis-assigned; fix it where it is built"
        )
    if "dim" in kinds:
        return "every leaf must agree on the size of each symbolic dimension"
    if kinds & {"missing", "unexpected"}:
        return f"the trees hold different keys; pass a tree with the keys of {expected_from}"
    if kinds & {"node_type", "node_data"}:
        return "a container changed kind (e.g. list vs tuple) or its static data changed"
    return None


def _is_class_name(x: object) -> bool:
    """Whether a ``node_type`` side names a class (``module.QualName``), not
    a builtin container kind or a leaf."""
    return isinstance(x, str) and "." in x and not x.startswith("leaf ")
