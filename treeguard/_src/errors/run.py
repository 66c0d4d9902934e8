"""The errors of running things: configuration, the model's own code, an
interrupted run, diagnosis, serving, requests, benchmarks; and the warning
for weights no hash checked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import TreeguardError, by_fields, cap_lines


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


class NonFiniteVersionError(ServingError):
    """A version whose params hold NaN or Inf, refused at load by the finite
    check (409): the version is to blame, never the request that asked for it.

    Args:
      version: the version refused.
      counts: ``{key path: NaN and Inf values}`` of each such leaf.
      dtypes: ``{key path: short dtype}`` of those leaves (``bf16``, ``f32``).
      described: the leaves as lines (path, count, dtype, shape).

    Attributes:
      version, counts, dtypes: the fields above.

    Example:
      >>> e = NonFiniteVersionError("v2", {"['w']": 1}, {"['w']": "bf16"}, "['w']: 1 value")
      >>> print(e)
      version v2 fails the finite check: ['w']: 1 value
      hint: it must not be served: verify and promote a version whose params are finite
      >>> e.dtypes, e.status
      ({"['w']": 'bf16'}, 409)
    """

    def __init__(
        self, version: str, counts: dict[str, int], dtypes: dict[str, str], described: str
    ) -> None:
        self.version = version
        self.counts = dict(counts)
        self.dtypes = dict(dtypes)
        super().__init__(
            f"version {version} fails the finite check: {described}",
            hint="it must not be served: verify and promote a version whose params are finite",
        )


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

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)
