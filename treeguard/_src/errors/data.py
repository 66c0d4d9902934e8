"""The errors about what a tree, a file or a check holds: mismatches, invalid
trees, formats, integrity, failed checks, non-finite values, recorder bundles,
traced values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from ..mismatch import Mismatch, format_mismatches
from .base import TreeguardError, cap_lines


class TreeMismatchError(TreeguardError, ValueError):
    """Two trees, or a tree and a spec, differ.

    Attributes:
      mismatches: every difference found, in report order.
      hint: the fix the message ends with, when given (else it is guessed).
      expected_from: where the expected side came from (``"the spec"``).
      actual_from: where the actual side came from (``"the tree"``).

    Example:
      >>> err = TreeMismatchError([Mismatch("['b']", "shape", (3,), (2, 3))])
      >>> err.mismatches[0].kind
      'shape'
    """

    exit_code = 1

    def __init__(
        self,
        mismatches: Sequence[Mismatch],
        *,
        expected_from: str = "the expected",
        actual_from: str = "the actual",
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.mismatches: tuple[Mismatch, ...] = tuple(mismatches)
        self.expected_from = expected_from
        self.actual_from = actual_from
        self.given_hint = hint
        # The hint line is part of the list's rendering: the one given, or a guess.
        text = format_mismatches(
            self.mismatches, expected_from=expected_from, actual_from=actual_from, hint=hint
        )
        super().__init__(text, context=context)

    def from_sources(self, *, expected_from: str, actual_from: str | None = None) -> Self:
        """The same mismatches rendered with other names for the two sides
        (a file's name where the library said ``like``).

        Example:
          >>> err = TreeMismatchError([Mismatch("['b']", "shape", (3,), (2,))],
          ...                         expected_from="`like`", actual_from="the file")
          >>> print(err.from_sources(expected_from="spec.json"))
          1 mismatch between the file and spec.json:
            ['b']: shape (3,) in spec.json, (2,) in the file
        """
        return type(self)(
            self.mismatches,
            expected_from=expected_from,
            actual_from=self.actual_from if actual_from is None else actual_from,
            context=self.context,
            hint=self.given_hint,
        )


class InvalidTreeError(TreeguardError, TypeError):
    """A tree that cannot be a parameter tree: it contains itself, it nests
    too deeply, or it holds leaves that are not arrays.

    Attributes:
      path: the key path of the first problem, in ``keystr`` form.
      problems: ``(path, description)`` for every problem found.
    """

    def __init__(
        self,
        problems: Sequence[tuple[str, str]],
        *,
        hint: str | None = None,
        context: str | None = None,
    ) -> None:
        self.problems = tuple(problems)
        self.path = self.problems[0][0] if self.problems else ""
        n = len(self.problems)
        lines = [f"{n} invalid {'leaf or node' if n == 1 else 'leaves or nodes'} in the tree:"]
        lines += cap_lines([f"  {p or '<root>'}: {d}" for p, d in self.problems])
        super().__init__("\n".join(lines), context=context, hint=hint)


class FormatError(TreeguardError, ValueError):
    """A file or JSON document is not ours, is truncated, oversized, malformed
    or of an unknown version.

    Attributes:
      where: the field or byte range at fault, when known.
    """

    def __init__(
        self,
        message: str = "",
        *,
        context: str | None = None,
        hint: str | None = None,
        where: str | None = None,
    ) -> None:
        self.where = where
        super().__init__(message, context=context, hint=hint)


class IntegrityError(TreeguardError, ValueError):
    """Stored bytes do not match their recorded hash or digest.

    Attributes:
      path: the key path (tensor name) whose bytes differ, when known.
      version: the store version whose file changed, when known.
    """

    exit_code = 1

    def __init__(
        self,
        message: str = "",
        *,
        path: str | None = None,
        version: str | None = None,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = path
        self.version = version
        super().__init__(message, context=context, hint=hint)


class VerificationError(TreeguardError, AssertionError):
    """An acceptance check failed (``Report.raise_if_failed``).

    Attributes:
      failed: the names of the failed checks, in run order.
      evidence: for each failed check, the lines that show why.

    Example:
      >>> e = VerificationError(failed=["finite"], evidence={"finite": ["['w'] 2 NaN"]},
      ...                       context="mlp", hint="see the report")
      >>> print(e)
      mlp: 1 check failed: finite
        finite: ['w'] 2 NaN
      hint: see the report
      >>> e.exit_code
      1
    """

    exit_code = 1

    def __init__(
        self,
        message: str = "",
        *,
        failed: Sequence[str] = (),
        evidence: Mapping[str, Sequence[str]] | None = None,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.failed = list(failed)
        self.evidence = {k: list(v) for k, v in (evidence or {}).items()}
        if not message and self.failed:
            n = len(self.failed)
            lines = [f"{n} check{'' if n == 1 else 's'} failed: {', '.join(self.failed)}"]
            lines += cap_lines(
                [
                    f"  {name}: {line}"
                    for name in self.failed
                    for line in self.evidence.get(name, [])
                ]
            )
            message = "\n".join(lines)
        super().__init__(message, context=context, hint=hint)


class NonFiniteError(TreeguardError, FloatingPointError):
    """An update produced NaN or Inf, and ``on_nonfinite="raise"`` (or a
    ``FlightRecorder``) refused it.

    The step is not applied: ``params`` (and ``state`` for an optimizer step)
    hold the values from before the step, bit for bit, even with donated
    buffers.

    Attributes:
      counts: ``{path: count}`` of non-finite values per leaf of the checked
        params (or, with donated buffers, of the updates), in flatten order.
      state_counts: the same for the optimizer state, if any.
      params: the params as they were before the step.
      state: the optimizer state as it was before the step, or None.
      path: the key path of the first leaf that holds NaN or Inf, when known.
      where: the tree that leaf is in (``"the grads"``), when known.
      bundle: the directory of the flight recorder's bundle of the step, or None.
      bundle_error: the ``RecorderError`` that kept the bundle from being
        written, or None; the error is also chained as ``__cause__``.

    Example:
      >>> e = NonFiniteError("1 leaf holds NaN or Inf in the grads:", counts={"['w']": 1},
      ...                    bundle="nan/000001-step7", hint="see the bundle")
      >>> print(e)
      1 leaf holds NaN or Inf in the grads:
      flight recorder bundle: nan/000001-step7
      hint: see the bundle
    """

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        counts: Mapping[str, int],
        state_counts: Mapping[str, int] | None = None,
        params: Any = None,
        state: Any = None,
        path: str | None = None,
        where: str | None = None,
        bundle: str | None = None,
        bundle_error: RecorderError | None = None,
        hint: str | None = None,
    ) -> None:
        self.counts = dict(counts)
        self.state_counts = dict(state_counts or {})
        self.params = params
        self.state = state
        self.path = path
        self.where = where
        self.bundle = bundle
        self.bundle_error = bundle_error
        super().__init__(message, hint=hint)

    def _render(self) -> str:
        text = self.message
        if self.bundle is not None:
            text += f"\nflight recorder bundle: {self.bundle}"
        if self.bundle_error is not None:
            e = self.bundle_error
            reason = f"{e.context}: {e.message}" if e.context else e.message
            text += f"\nthe flight recorder wrote no bundle: {reason}"
            if self.bundle_error.hint:
                text += f"\n  ({self.bundle_error.hint})"
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text


class RecorderError(TreeguardError, RuntimeError):
    """The flight recorder could not write its bundle of a step that produced
    NaN or Inf: a recorder directory that is a symbolic link or no
    directory, a full disk, a directory it may not write, a batch it cannot
    store. It travels with the ``NonFiniteError`` of the step
    (``.bundle_error``, and chained), which is raised either way.

    Attributes:
      directory: the recorder's directory.
      reason: the short cause (``"ENOSPC"``, ``"a symbolic link"``).
    """

    def __init__(
        self,
        message: str,
        *,
        directory: str,
        reason: str,
        hint: str | None = None,
    ) -> None:
        self.directory = directory
        self.reason = reason
        super().__init__(message, context=directory, hint=hint)


class TracedValueError(TreeguardError, TypeError):
    """A check needs concrete values but was called inside a JAX
    transformation (``jit``, ``vmap``, ``grad``), where values are abstract."""
