"""The exported function checked against the live model before it is stored.

``validate`` runs the deserialized artifact and the model's own ``apply``
on the model's generated positive cases (and its stored reference batches),
each restricted to the serving spec's inputs, and compares every output
leaf at the model's tolerance (``Model.tolerance_policy``). The first case
that differs is an ``ExportValidationError`` naming the case, the output
and how far apart they are. With a symbolic batch axis every case runs as it
is; an artifact exported per bucket runs each case padded to its bucket
(as the server runs it), and a case larger than the largest bucket is left
out.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..errors import ExportValidationError
from ..serving.buckets import bucket_for
from ..serving.runner import keystr_of
from ..serving.spec import ServingSpec
from ..verify.cases import generate_cases
from ..verify.compare import compare_trees
from ..verify.model import Model
from ..verify.refs import load_references
from .exporting import served_function
from .model import run_bucket


def cases_of(model: Model, spec: ServingSpec) -> list[tuple[str, list[np.ndarray[Any, Any]]]]:
    """The model's positive cases and reference batches as the serving
    inputs' leaves, in the spec's order; a case without every input is left out."""
    batches = [(c.name, c.batch) for c in generate_cases(model) if not c.negative]
    if model.references is not None:
        refs = load_references(model.references)
        batches += [(f"reference {c.name}", c.batch) for c in refs.cases if c.name in refs.expected]
    invalid = {"invalid_shape", *(inv.name for inv in model.invalid_inputs)}
    paths = spec.input_paths
    out = []
    for name, batch in batches:
        if name in invalid:
            continue
        found = {keystr_of(p): np.asarray(x) for p, x in jax.tree.leaves_with_path(batch)}
        if all(p in found for p in paths):
            out.append((name, [found[p] for p in paths]))
    return out


def validate(
    model: Model, spec: ServingSpec, params: Any, table: dict[int | None, Any]
) -> list[str]:
    """Checks the exported parts against ``model.apply`` on every case.

    Args:
      model: the live model.
      spec: the serving spec the function was exported for.
      params: the params both run with.
      table: the ``jax.export.Exported`` parts by batch size, as read back
        from their bytes (``compat.deserialize``).

    Returns:
      The names of the cases compared.

    Raises:
      ExportValidationError: naming the first case and output that differ
        (shape, dtype or values beyond the model's tolerance).
    """
    leaves, treedef = jax.tree.flatten(params)
    live = jax.jit(served_function(model, spec, treedef))
    sizes = sorted(k for k in table if k is not None)
    cases = [
        (name, inputs)
        for name, inputs in cases_of(model, spec)
        if None in table or bucket_for(int(inputs[0].shape[0]), sizes) is not None
    ]
    if not cases:
        raise ExportValidationError(
            f"model {model.name!r} has no positive case holding every serving input "
            f"({', '.join(spec.input_paths)}) to check the export on",
            model=model.name,
            case="",
            path="",
            hint="give the model cases= with those inputs, or serve fewer inputs (--input)",
        )
    for name, inputs in cases:
        want = jax.tree.map(np.asarray, live(leaves, inputs))
        if None in table:
            got = table[None].call(leaves, inputs)
        else:
            got = run_bucket(table, leaves, inputs)
        _same(model, name, jax.tree.map(np.asarray, got), want)
    return [name for name, _ in cases]


def _same(model: Model, case: str, got: Any, want: Any) -> None:
    found, errors = compare_trees(got, want, tolerance=model.tolerance_policy)
    if found:
        m = found[0]
        raise ExportValidationError(
            f"model {model.name!r}: the exported function's outputs differ from the live "
            f"model's on the case {case!r}: {m.path or '<root>'}: {m.kind} {m.actual} exported, "
            f"{m.expected} live",
            model=model.name,
            case=case,
            path=m.path,
            hint="the function is not the same once exported; serve it with its Python code",
        )
    for err in errors:
        if not err.ok:
            raise ExportValidationError(
                f"model {model.name!r}: the exported function's output differs from the live "
                f"model's on the case {case!r}: {err.describe()}",
                model=model.name,
                case=case,
                path=err.path,
                hint="the function is not the same once exported (a host-dependent op, "
                "another precision); serve it with its Python code, or widen the model's "
                "tolerance on purpose",
            )
