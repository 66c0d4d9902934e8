"""The exception hierarchy. Every treeguard error subclasses ``TreeguardError``
and a builtin, so existing ``except ValueError`` clauses keep working."""

from __future__ import annotations

from collections.abc import Sequence

from .mismatch import Mismatch, format_mismatches


class TreeguardError(Exception):
    """Base class of every error treeguard raises."""


class TreeMismatchError(TreeguardError, ValueError):
    """Two trees, or a tree and a spec, differ.

    Attributes:
      mismatches: every difference found, in report order.
      expected_from: where the expected side came from (``"the spec"``).
      actual_from: where the actual side came from (``"the tree"``).

    Example:
      >>> err = TreeMismatchError([Mismatch("['b']", "shape", (3,), (2, 3))])
      >>> err.mismatches[0].kind
      'shape'
    """

    def __init__(
        self,
        mismatches: Sequence[Mismatch],
        *,
        expected_from: str = "the expected",
        actual_from: str = "the actual",
        context: str | None = None,
    ) -> None:
        self.mismatches: tuple[Mismatch, ...] = tuple(mismatches)
        self.expected_from = expected_from
        self.actual_from = actual_from
        text = format_mismatches(
            self.mismatches, expected_from=expected_from, actual_from=actual_from
        )
        super().__init__(f"{context}: {text}" if context else text)


class InvalidTreeError(TreeguardError, TypeError):
    """A tree that cannot be a parameter tree: it contains itself, or it holds
    leaves that are not arrays.

    Attributes:
      path: the key path of the first problem, in ``keystr`` form.
      problems: ``(path, description)`` for every problem found.
    """

    def __init__(self, problems: Sequence[tuple[str, str]], *, hint: str | None = None) -> None:
        self.problems = tuple(problems)
        self.path = self.problems[0][0] if self.problems else ""
        n = len(self.problems)
        lines = [f"{n} invalid {'leaf or node' if n == 1 else 'leaves or nodes'} in the tree:"]
        lines += [f"  {p or '<root>'}: {d}" for p, d in self.problems[:20]]
        if n > 20:
            lines.append(f"  ... and {n - 20} more")
        if hint:
            lines.append(f"hint: {hint}")
        super().__init__("\n".join(lines))


class FormatError(TreeguardError, ValueError):
    """A file or JSON document is not ours, is truncated, oversized, malformed
    or of an unknown version."""


class IntegrityError(TreeguardError, ValueError):
    """Stored bytes do not match their recorded hash.

    Attributes:
      path: the key path (tensor name) whose bytes differ, when known.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)


class VerificationError(TreeguardError, AssertionError):
    """An acceptance check failed."""


# -- benchmarks -------------------------------------------------------------------


class BenchError(TreeguardError, ValueError):
    """A benchmark cannot be run or compared as asked: a bad option, a result
    file that holds no benchmark, or two results that cannot be paired."""


class MachineMismatchError(BenchError):
    """Two benchmark results come from machines whose fingerprints differ, so
    their times cannot be compared.

    Attributes:
      differences: ``(key, base value, candidate value)`` for each differing key.
    """

    def __init__(self, differences: Sequence[tuple[str, object, object]]) -> None:
        self.differences = tuple(differences)
        lines = [f"the two results come from different machines ({len(self.differences)} keys):"]
        lines += [f"  {k}: {a!r} in the base, {b!r} in the candidate" for k, a, b in differences]
        lines.append(
            "hint: compare runs from one machine, run both sides in one process with "
            "`treeguard bench ab`, or pass allow_different_machines=True "
            "(--allow-different-machines) to compare anyway"
        )
        super().__init__("\n".join(lines))
