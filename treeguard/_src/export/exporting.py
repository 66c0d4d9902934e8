"""Exporting a model's serving function with ``jax.export``.

``export_serving`` traces ``served(param_leaves, input_leaves)`` (see
``description.py``) with the batch axis as the symbol ``"B"``, so one
artifact serves every bucket, and serializes it. A function that cannot take
a symbolic batch axis (a Python branch on its size, say) is exported once per
bucket of the serving spec instead. A function ``jax.export`` refuses either
way (a host callback, a custom call without a compatibility guarantee, an
output tree it cannot serialize) is an ``ExportError`` naming why; nothing
is written here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ..errors import ExportError
from ..serving.spec import ServingSpec
from ..verify.model import BATCH, Model

#: The longest reason quoted from ``jax.export``'s own error.
_REASON = 600


def served_function(model: Model, spec: ServingSpec, params_treedef: Any) -> Callable[..., Any]:
    """The function an artifact holds: ``model.apply`` on the params given
    as their leaves and the serving spec's inputs given as theirs."""
    inputs = spec.inputs.treedef

    def served(param_leaves: Sequence[Any], input_leaves: Sequence[Any]) -> Any:
        params = jax.tree.unflatten(params_treedef, list(param_leaves))
        return model.apply(params, inputs.unflatten(list(input_leaves)))

    return served


def input_shapes(spec: ServingSpec, batch: Any) -> list[jax.ShapeDtypeStruct]:
    """Each serving input's shape and dtype with ``batch`` as its first axis."""
    return [
        jax.ShapeDtypeStruct(  # type: ignore[no-untyped-call]
            (batch, *(int(d) for d in leaf.shape[1:])), leaf.dtype
        )
        for leaf in spec.inputs.leaves
    ]


@dataclasses.dataclass(frozen=True)
class Exports:
    """A model's exported serving function: one, or one per bucket.

    Attributes:
      batches: the batch size of each part; empty for one part whose batch
        axis is symbolic.
      exported: each part's ``jax.export.Exported``.
      blobs: each part's serialized bytes.
    """

    batches: tuple[int, ...]
    exported: list[Any]
    blobs: list[bytes]


def export_serving(
    model: Model, spec: ServingSpec, params: Any, *, platforms: Sequence[str] | None = None
) -> Exports:
    """Exports ``model``'s serving function for ``params``' structure, shapes
    and dtypes: once with a symbolic batch axis, else once per bucket of ``spec``.

    Args:
      model: the ``treeguard.verify.Model``.
      spec: the ``ServingSpec`` whose inputs the function takes.
      params: the params (or their ``jax.ShapeDtypeStruct``s).
      platforms: the platforms to export for; None for this process's default backend.

    Returns:
      The ``Exports``.

    Raises:
      ExportError: naming why ``jax.export`` refused the function (with a
        symbolic batch axis and per bucket).
    """
    leaves, treedef = jax.tree.flatten(params)
    shapes = [
        jax.ShapeDtypeStruct(x.shape, x.dtype)  # type: ignore[no-untyped-call]
        for x in leaves
    ]
    served = served_function(model, spec, treedef)
    if _CALLBACK in str(jax.make_jaxpr(served)(shapes, input_shapes(spec, spec.buckets[0]))):
        # jax.export fails on it with no reason given; its bytes would hold a pointer
        # into this process
        raise _refused(
            model,
            "it calls back into Python (a host callback: jax.pure_callback, io_callback, "
            "jax.debug.callback), which no other process can run",
            _hint("callback"),
        )
    try:
        exported, blob = export_function(model, served, shapes, spec, platforms=platforms)
        return Exports((), [exported], [blob])
    except ExportError as symbolic:
        try:
            parts = [
                export_function(model, served, shapes, spec, platforms=platforms, batch=b)
                for b in spec.buckets
            ]
        except ExportError as e:
            raise _refused(
                model,
                f"{e.message.split(': ', 1)[-1]} (and with a symbolic batch axis: "
                f"{symbolic.message.split(': ', 1)[-1]})",
                e.hint or "",
            ) from e
    return Exports(tuple(spec.buckets), [e for e, _ in parts], [b for _, b in parts])


def export_function(
    model: Model,
    served: Callable[..., Any],
    shapes: list[Any],
    spec: ServingSpec,
    *,
    platforms: Sequence[str] | None = None,
    batch: int | None = None,
) -> tuple[Any, bytes]:
    """Exports ``served`` for params of ``shapes`` and ``spec``'s inputs with
    ``batch`` rows (None: the symbol ``"B"``).

    Returns:
      The ``jax.export.Exported`` and its serialized bytes.

    Raises:
      ExportError: naming why ``jax.export`` refused the function.
    """
    from jax import export  # lazy: only a command that exports imports jax.export

    rows = export.symbolic_shape(BATCH)[0] if batch is None else batch
    try:
        exported = export.export(
            jax.jit(served), platforms=None if platforms is None else tuple(platforms)
        )(shapes, input_shapes(spec, rows))
        blob = bytes(exported.serialize())
    except Exception as e:
        raise _refused(model, _reason(e), _hint(str(e))) from e
    return exported, blob


#: What a host callback's primitive is named in a jaxpr (pure_callback, io_callback...).
_CALLBACK = "callback"


def _refused(model: Model, why: str, hint: str) -> ExportError:
    return ExportError(
        f"model {model.name!r}: jax.export cannot export its serving function: {why}",
        model=model.name,
        hint=hint,
    )


def _reason(e: BaseException) -> str:
    """``jax.export``'s refusal as one line, control characters spelled out, bounded."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {' '.join(lines[:3])}" if lines else type(e).__name__
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= _REASON else text[: _REASON - 1] + "…"


def _hint(text: str) -> str:
    if "custom call" in text.lower() or "callback" in text.lower():
        return (
            "the function calls back into Python (jax.pure_callback, io_callback, "
            "jax.debug.callback): serve it with its Python code (treeguard serve MODULE:ATTR)"
        )
    if "symbolic" in text.lower() or "shape" in text.lower():
        return (
            f"apply must take any size of the batch axis {BATCH!r} (no Python branch on it); "
            "or serve it with its Python code"
        )
    return "serve it with its Python code (treeguard serve MODULE:ATTR)"
