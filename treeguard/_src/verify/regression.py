"""The ``regression`` check: params and every stored case's outputs, loss and
grads against the recorded references, with the backend they were recorded on."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ..mismatch import Mismatch
from ..paths import keystr
from .compare import compare_stored
from .context import CheckResult, Context, mismatch_lines, outcome
from .refs import References


def _relabel(m: Mismatch, prefix: str) -> Mismatch:
    return dataclasses.replace(m, path=m.path[len(prefix) :])


def regression_errors(ctx: Context, refs: References) -> tuple[list[str], list[dict[str, Any]]]:
    """Compares params and every stored case's outputs, loss and grads with the references.

    The file gives custom nodes (namedtuples, flax structs, equinox modules)
    back as dicts, so the structure is compared with the file's stored spec,
    which names their classes, and the values leaf by leaf along key paths.
    """
    model = ctx.model
    params = ctx.params()
    tol = model.regression_policy([jax.default_backend(), refs.backend])
    bad: list[str] = []
    rows: list[dict[str, Any]] = []
    stored: dict[str, Any] = {"params": refs.params, "cases": {}, "invalid": {}}
    current: dict[str, Any] = {"params": params, "cases": {}, "invalid": {}}
    for case in refs.cases:
        exp = refs.expected.get(case.name)
        if exp is None:
            current["invalid"][case.name] = {"batch": case.batch}
            stored["invalid"][case.name] = {"batch": case.batch}
            continue
        result = ctx.programs.results(case)
        current["cases"][case.name] = {
            "batch": case.batch,
            "outputs": result.outputs,
            "loss": result.loss,
            "grads": result.grads,
        }
        stored["cases"][case.name] = {
            "batch": case.batch,
            "outputs": exp.outputs,
            "loss": exp.loss,
            "grads": exp.grads,
        }
    found, errs = compare_stored(current, stored, spec=refs.spec, tolerance=tol)
    parts = [("['params']", "params", "-", "params")]
    for name in current["cases"]:
        for kind in ("outputs", "loss", "grads"):
            prefix = keystr((("key", "cases"), ("key", name), ("key", kind)))
            parts.append((prefix, f"case {name!r} {kind}", name, kind))
    listed: set[int] = set()
    for prefix, label, case_name, kind in parts:
        mine = [i for i, m in enumerate(found) if i not in listed and _under(m.path, prefix)]
        listed.update(mine)
        bad.extend(
            mismatch_lines(
                [_relabel(found[i], prefix) for i in mine], label, "the references", "this run"
            )
        )
        for full in errs:
            if not _under(full.path, prefix):
                continue
            err = dataclasses.replace(full, path=full.path[len(prefix) :])
            rows.append({"case": case_name, "kind": kind, **err.to_dict()})
            if not err.ok:
                bad.append(f"{label}: {err.describe()}")
    rest = [m for i, m in enumerate(found) if i not in listed]
    bad.extend(mismatch_lines(rest, f"{refs.path.name}", "the references", "this run"))
    return bad, rows


def _under(path: str, prefix: str) -> bool:
    return path == prefix or (path.startswith(prefix) and path[len(prefix)] in "[.")


def check_regression(ctx: Context) -> CheckResult:
    """Every stored case's outputs, loss and grads match the references."""
    refs = ctx.references
    if refs is None:
        if ctx.record:
            return CheckResult("regression", "pass", "no references yet; recording new ones")
        return CheckResult("regression", "skip", "the model declares no references")
    bad, rows = regression_errors(ctx, refs)
    n = len(rows)
    if ctx.record and bad:
        return CheckResult(
            "regression",
            "pass",
            f"re-recording: {len(bad)} difference(s) from the old references (listed)",
            [f"changed: {b}" for b in bad],
            rows,
        )
    matched = f"{n} leaves on {len(refs.expected)} cases and the params match {refs.path.name}"
    differ = f"{len(bad)} difference(s) from the references {refs.path.name}"
    now = jax.default_backend()
    if refs.backend is None or refs.backend == now:
        return outcome("regression", bad, matched, differ, rows=rows)
    where = f"references recorded on {refs.backend} ({refs.device_kind}), this run on {now}"
    if ctx.model.declares_backend(refs.backend) or ctx.model.declares_backend(now):
        at = f"{where}, at the declared cross-backend tolerance"
        return outcome("regression", bad, f"{matched} ({at})", f"{differ} ({at})", rows=rows)
    return outcome(
        "regression",
        bad,
        f"{matched} ({where})",
        cross_backend_summary(refs.backend, refs.device_kind, now),
        evidence=[
            f"{differ}: another backend's arithmetic (a TPU rounds float32 matmuls to "
            "bfloat16 by default), not necessarily a regression"
        ],
        rows=rows,
    )


def cross_backend_summary(recorded: str, device_kind: str | None, now: str) -> str:
    """The failing verdict of a run compared with another backend's references.

    Example:
      >>> print(cross_backend_summary("tpu", "TPU v5 lite", "cpu").replace(": ", ":\\n"))
      references recorded on tpu (TPU v5 lite), this run on cpu:
      record references for this backend with --record, or declare cross-backend tolerances
    """
    return (
        f"references recorded on {recorded} ({device_kind}), this run on {now}: record "
        "references for this backend with --record, or declare cross-backend tolerances"
    )
