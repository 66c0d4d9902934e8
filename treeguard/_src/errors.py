"""Every exception treeguard raises, in one place.

The hierarchy (each class also subclasses the builtin in brackets, so an
existing ``except ValueError`` keeps working)::

    TreeguardError
    ├── TreeMismatchError      [ValueError]        two trees or specs differ
    ├── InvalidTreeError       [TypeError]         a cycle, a non-array leaf, too deep
    ├── FormatError            [ValueError]        a file or JSON that is not ours
    ├── IntegrityError         [ValueError]        bytes that do not match their hash
    ├── VerificationError      [AssertionError]    an acceptance check failed
    ├── NonFiniteError         [FloatingPointError] an update produced NaN or Inf
    ├── RecorderError          [RuntimeError]      a flight-recorder bundle not written
    ├── TracedValueError       [TypeError]         a concrete check under a transform
    ├── ConfigError            [ValueError]        a misconfigured model or command
    ├── ModelCodeError         [RuntimeError]      the model's own code failed to import or build
    │   └── ModelExitError                         the model's code raised SystemExit
    ├── RunInterruptedError    [RuntimeError]      a run stopped by KeyboardInterrupt
    ├── DiagnosisError         [ValueError]        a diagnosis that cannot run as asked
    ├── ServingError           [RuntimeError]      the server refused a swap or rollback
    ├── InvalidRequestError    [ValueError]        a request refused before device work
    ├── BenchError             [ValueError]        a benchmark that cannot run or compare
    │   └── MachineMismatchError                   results from two different machines
    └── StoreError             [ValueError]        the store refused an operation
        ├── NotAStoreError                         a directory that is not a store
        ├── UnknownVersionError [LookupError]      no such version
        │   └── RetiredVersionError                a name gc retired: never current again
        ├── DanglingPointerError                   the pointer names a version that is gone
        ├── SignatureError                         a verdict unsigned or wrongly signed
        ├── ConflictError                          another process changed it first
        └── StorageError                           the disk or the bucket failed

    UnverifiedWeightsWarning   [UserWarning]       weights loaded that no hash checked

A message is rendered from the error's fields, never edited as a string:
``context`` (where: a file, a version), the message itself, and ``hint`` (the
likely fix), always as a last line ``hint: ...``. Each class carries the exit
code the command line uses for it (``exit_code``): 1 for a check that ran and
failed (a mismatch, a hash that differs, a refused store operation), 2 for
input that could not be used, 4 for a model whose own code failed or exited,
130 for an interrupted run. The command line reads it from the class and
never chooses another.

Example:
  >>> e = FormatError("header is not JSON", context="model.safetensors", hint="re-save it")
  >>> print(e)
  model.safetensors: header is not JSON
  hint: re-save it
  >>> e.exit_code
  2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from .mismatch import Mismatch, format_mismatches

#: How many problems a message lists before it says how many it left out.
LISTED = 20


def cap_lines(lines: Sequence[str], *, limit: int = LISTED, indent: str = "  ") -> list[str]:
    """The first ``limit`` lines, then one line saying how many were left out.

    Example:
      >>> cap_lines(["a", "b", "c"], limit=2)
      ['a', 'b', '  ... and 1 more']
    """
    out = list(lines[:limit])
    if len(lines) > limit:
        out.append(f"{indent}... and {len(lines) - limit} more")
    return out


class TreeguardError(Exception):
    """Base class of every error treeguard raises.

    Args:
      message: what is wrong, naming the key path and both values.
      context: where it happened (a file, a version); printed first.
      hint: the likely fix; printed as a last line ``hint: ...``.

    Attributes:
      message, context, hint: the fields the text is rendered from.
      exit_code: the command line's exit status for this error.
    """

    exit_code = 2

    def __init__(self, message: str = "", *, context: str | None = None, hint: str | None = None):
        self.message = message
        self.context = context
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.context}: {self.message}" if self.context else self.message
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text

    def __str__(self) -> str:
        return self._render()


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


class StoreError(TreeguardError, ValueError):
    """The store refused an operation: promoting an unverified version,
    rolling back with no previous verified version, a directory that is not
    a store, a damaged pointer or status file.

    Attributes:
      version: the version concerned, when there is one.
    """

    exit_code = 1

    def __init__(
        self,
        message: str = "",
        *,
        version: str | None = None,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.version = version
        super().__init__(message, context=context, hint=hint)


class NotAStoreError(StoreError):
    """A directory that is not a treeguard store (no ``STORE.json``), or a
    store root that is no directory: nothing there can be used."""

    exit_code = 2


class UnknownVersionError(StoreError, LookupError):
    """No such version in the store, or a name that cannot be a version
    (one that would escape the store's root)."""

    exit_code = 2

    def __str__(self) -> str:  # LookupError would quote the message
        return self._render()


class RetiredVersionError(UnknownVersionError):
    """A version whose name gc retired (it is being removed, or was): it is
    never made current again, so ``promote`` and ``rollback`` refuse it."""


class DanglingPointerError(StoreError):
    """The pointer names a version the store does not hold: the store is
    damaged, and nothing that depends on what is current (``gc``) acts on
    a guess. ``ArtifactStore.repair`` (``treeguard store repair``) points
    it at a version named by a person.

    Attributes:
      version: the missing version the pointer names.
    """


class SignatureError(StoreError):
    """A store opened with a key found a verdict that is unsigned, or signed
    with another key, or that no longer matches what it signed: the verdict
    is not trusted, whatever its status says."""


class ConflictError(StoreError):
    """Another process changed the store first: a promote or rollback that
    lost the race for the pointer, which is left as the winner made it.

    Attributes:
      version: the version the winner made current, when known.
    """


class StorageError(StoreError):
    """The storage under a store failed: a full disk, a refused or timed-out
    connection, a server error. The message names the operation and the
    object, never credentials; the store is left as it was before the
    operation. Exit code 2: what failed is the machine or the network, not
    a check of the version."""

    exit_code = 2


class ConfigError(TreeguardError, ValueError):
    """The model or the command is misconfigured: a bad ``MODULE:ATTR``, a
    batch spec without a batch axis, missing references. ``treeguard verify``
    exits with status 2 on it."""


class ModelCodeError(TreeguardError, RuntimeError):
    """The model's own code failed where treeguard ran it to get the model:
    importing its module raised (a ``SyntaxError``, a ``RuntimeError`` at
    import, an import of its own that is missing), or the factory named by
    ``MODULE:ATTR`` raised. The command line exits 4, never 0 or 1, so no
    ``treeguard verify ... && deploy`` goes on.

    Attributes:
      target: the ``MODULE:ATTR`` concerned.
      stage: ``"import"``, ``"factory"`` or ``"run"``.
      cause: the exception's type name (``"SyntaxError"``).
    """

    exit_code = 4

    def __init__(
        self,
        message: str,
        *,
        target: str,
        stage: str,
        cause: str,
        hint: str | None = None,
    ) -> None:
        self.target = target
        self.stage = stage
        self.cause = cause
        super().__init__(message, hint=hint)


class ModelExitError(ModelCodeError):
    """Model code raised ``SystemExit`` (``sys.exit(0)`` in a helper, an
    argparse parse at import) while a command ran: the run did not finish,
    whatever the status it asked for.

    Attributes:
      code: the status the model code passed to ``sys.exit``.
    """

    def __init__(
        self,
        message: str,
        *,
        target: str,
        stage: str,
        code: object,
        hint: str | None = None,
    ) -> None:
        self.code = code
        super().__init__(message, target=target, stage=stage, cause="SystemExit", hint=hint)


class RunInterruptedError(TreeguardError, RuntimeError):
    """A run stopped by ``KeyboardInterrupt`` (Ctrl-C, or model code that
    raised it): nothing was concluded. The command line exits 130, as a
    shell does for an interrupted program."""

    exit_code = 130


class DiagnosisError(TreeguardError, ValueError):
    """A diagnosis cannot run as asked: an unknown candidate, a malformed
    tolerance rule, a recorded trace of another program. ``treeguard
    diagnose`` exits with status 2 on it."""


class ServingError(TreeguardError, RuntimeError):
    """The server refused an operation: a swap to a version that cannot be
    served, a rollback with nothing to return to, a model that does not fit.

    Attributes:
      status: the HTTP status the refusal maps to.
    """

    exit_code = 1

    def __init__(self, message: str, *, status: int = 409, hint: str | None = None) -> None:
        self.status = status
        super().__init__(message, hint=hint)


class InvalidRequestError(TreeguardError, ValueError):
    """An inference request the server refuses before any device work.

    The message names the input's path and the expected and actual shape or
    dtype; it never holds a value from the request.

    Attributes:
      status: 400 (not JSON), 413 (over a limit) or 422 (wrong inputs).
      reason: ``shape``, ``dtype``, ``size``, ``schema`` or ``nonfinite``.
    """

    def __init__(
        self, message: str, *, status: int = 422, reason: str = "schema", hint: str | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        super().__init__(message, hint=hint)


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
        lines += cap_lines(
            [f"  {k}: {a!r} in the base, {b!r} in the candidate" for k, a, b in differences]
        )
        super().__init__(
            "\n".join(lines),
            hint="compare runs from one machine, run both sides in one process with "
            "`treeguard bench ab`, or pass allow_different_machines=True "
            "(--allow-different-machines) to compare anyway",
        )


class UnverifiedWeightsWarning(UserWarning):
    """Weights were loaded from a file that holds no hashes (a safetensors file
    treeguard did not write), so nothing checked that its bytes are the ones
    meant. Emitted by ``load(..., unverified="warn")``; ``unverified="allow"``
    loads such a file without it, and the default refuses the file.

    Attributes:
      file: the file the weights came from.
    """

    def __init__(self, file: str) -> None:
        self.file = file
        super().__init__(
            f"{file}: loaded without any hash check: the file holds no hashes and no "
            "contract (a safetensors file treeguard did not write); only its header's "
            "structure and the names, shapes and dtypes were checked\n"
            'hint: pass unverified="allow" to load it on purpose without this warning, or '
            "turn it into a hashed checkpoint once with `treeguard import SRC DST`"
        )


#: The public classes, shown as ``treeguard.X`` in tracebacks.
PUBLIC = (
    TreeguardError,
    TreeMismatchError,
    InvalidTreeError,
    FormatError,
    IntegrityError,
    VerificationError,
    NonFiniteError,
    RecorderError,
    TracedValueError,
    StoreError,
    NotAStoreError,
    UnknownVersionError,
    SignatureError,
    ConflictError,
    StorageError,
    ConfigError,
    ModelCodeError,
    ModelExitError,
    RunInterruptedError,
    DiagnosisError,
    ServingError,
    InvalidRequestError,
    BenchError,
    MachineMismatchError,
    UnverifiedWeightsWarning,
)
for _cls in PUBLIC:
    _cls.__module__ = "treeguard"
del _cls
