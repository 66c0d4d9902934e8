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


# -- serving ------------------------------------------------------------------


class ServingError(TreeguardError, RuntimeError):
    """The server refused an operation: a swap to a version that cannot be
    served, a rollback with nothing to return to, a model that does not fit.

    Attributes:
      status: the HTTP status the refusal maps to.
    """

    def __init__(self, message: str, *, status: int = 409) -> None:
        self.status = status
        super().__init__(message)


class InvalidRequestError(TreeguardError, ValueError):
    """An inference request the server refuses before any device work.

    The message names the input's path and the expected and actual shape or
    dtype; it never holds a value from the request.

    Attributes:
      status: 400 (not JSON), 413 (over a limit) or 422 (wrong inputs).
      reason: ``shape``, ``dtype``, ``size``, ``schema`` or ``nonfinite``.
    """

    def __init__(self, message: str, *, status: int = 422, reason: str = "schema") -> None:
        self.status = status
        self.reason = reason
        super().__init__(message)
