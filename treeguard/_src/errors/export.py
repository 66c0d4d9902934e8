"""The errors of exported models: a function that cannot be exported, an
export that does not match the live model, and a stored artifact that cannot
be served here (another jax's or platform's, missing, or changed)."""

from __future__ import annotations

from .base import TreeguardError


class ExportError(TreeguardError, ValueError):
    """The model's serving function cannot be exported with ``jax.export``
    (a host callback, an output that is not a plain tree, a shape the batch
    symbol cannot take); nothing was stored.

    Attributes:
      model: the model's name.
    """

    exit_code = 2

    def __init__(
        self, message: str, *, model: str, context: str | None = None, hint: str | None = None
    ) -> None:
        self.model = model
        super().__init__(message, context=context, hint=hint)


class ExportValidationError(ExportError):
    """The exported function does not give the live model's outputs on one
    of the model's cases, within the model's tolerance; nothing was stored.

    Attributes:
      model: the model's name.
      case: the case it differs on.
      path: the output's key path (``""`` for the root).
    """

    exit_code = 1

    def __init__(
        self, message: str, *, model: str, case: str, path: str, hint: str | None = None
    ) -> None:
        self.case, self.path = case, path
        super().__init__(message, model=model, hint=hint)


class ArtifactError(TreeguardError, RuntimeError):
    """A version's exported artifact cannot be served here: it is missing,
    not covered by the version's verdict, changed since it was verified, or
    written for another jax (outside ``jax.export``'s compatibility window)
    or another platform. The message names both sides: what the artifact
    says and what this process runs.

    Attributes:
      version: the store's version whose artifact it is.
      field: what differs: ``missing``, ``verdict``, ``digest``, ``jax``,
        ``platform``, ``function`` (not the function served) or ``inputs``
        (a serving spec with other inputs).
    """

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        version: str,
        field: str,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.version, self.field = version, field
        super().__init__(message, context=context, hint=hint)
