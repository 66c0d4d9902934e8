"""The named checks of ``treeguard verify``.

Each check takes the shared ``Context`` and returns a ``CheckResult``: a
stable name, a status (``pass``, ``fail`` or ``skip``), a one-line summary,
evidence lines that name the cause, and structured rows for the reports.
A check that raises unexpectedly fails with the exception as its evidence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..diff import mismatches
from ..env import environment, environment_diff
from ..keys import trace_keys
from ..leaf import summarize
from ..mismatch import Mismatch
from ..nonfinite import find_nonfinite, host_nan_inf
from ..paths import keystr
from ..spec import TreeSpec, spec_of
from .cases import Case
from .compare import compare_stored, compare_trees, leaves_with_paths
from .context import LISTED, CheckResult, Context, mismatch_lines
from .model import BATCH, Model
from .performance import check_performance
from .programs import step_function
from .refs import References

#: The checks, in the order they run; the names are part of the interface.
CHECKS: tuple[str, ...] = (
    "contract",
    "keys",
    "finite",
    "negative",
    "transforms",
    "environment",
    "regression",
    "training",
    "splits",
    "performance",
)

#: Environment keys whose change invalidates stored references: they change
#: the dtypes or the arithmetic the references were computed with.
INVALIDATING = ("x64", "matmul_precision")


def _batch_size(batch: Any, spec: TreeSpec) -> int | None:
    leaves = jax.tree.leaves(batch)
    for leaf, ls in zip(leaves, spec.leaves):
        if BATCH in ls.shape and len(leaf.shape) == len(ls.shape):
            return int(leaf.shape[ls.shape.index(BATCH)])
    return None


def _result(
    name: str,
    bad: list[str],
    ok_summary: str,
    fail_summary: str,
    *,
    evidence: list[str] | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> CheckResult:
    """A fail listing ``bad`` (then the other evidence) if there is any, else a pass."""
    info = list(evidence or [])
    if bad:
        return CheckResult(name, "fail", fail_summary, [*bad, *info], list(rows or []))
    return CheckResult(name, "pass", ok_summary, info, list(rows or []))


def _short(x: Any) -> str:
    leaves = jax.tree.leaves(x)
    if len(leaves) == 1 and leaves[0] is x:
        a = np.asarray(x)
        return summarize(a.shape, a.dtype)
    return f"a tree of {len(leaves)} leaves"


# -- 1. contract ----------------------------------------------------------------


def check_contract(ctx: Context) -> CheckResult:
    """Params, outputs, loss and grads match their contracts on every positive case."""
    model = ctx.model
    params = ctx.params()
    bad: list[str] = []
    info: list[str] = []
    pspec = spec_of(params)
    stored = model.stored_params_spec()
    if stored is not None:
        found = mismatches(params, stored)
        bad += mismatch_lines(found, "params", "the stored params spec", "init's params")
        if not found:
            info.append(
                f"params match the stored spec ({pspec.num_leaves} leaves, {pspec.num_params} "
                "values)"
            )
    else:
        info.append(
            f"params: {pspec.num_leaves} leaves, {pspec.num_params} values (no stored spec)"
        )
    grads_bad = 0
    out_specs: dict[str, TreeSpec] = {}
    for lines in ctx.rejected.values():
        bad += lines
    if ctx.rejected:
        bad.append(
            f"{len(ctx.rejected)} case(s) do not match Model.batch_spec and ran in no other "
            "check; hint: build each case's leaves with the spec's shapes and dtypes, e.g. "
            "np.asarray(x, np.float32)"
        )
    for case in ctx.positive:
        batch = ctx.batch(case)
        where = f"case {case.name!r}"
        n = _batch_size(batch, model.batch_spec)
        result = ctx.programs.results(case)
        outputs = result.outputs
        if model.output_spec is not None:
            found = mismatches(outputs, model.output_spec)
            bad += mismatch_lines(found, f"{where} outputs", "the output spec", "apply's outputs")
            if not found and n is not None:
                for leaf, ls in zip(jax.tree.leaves(outputs), model.output_spec.leaves):
                    if BATCH in ls.shape and leaf.shape[ls.shape.index(BATCH)] != n:
                        bad.append(
                            f"{where} outputs: {ls.path or '<root>'} has batch size "
                            f"{leaf.shape[ls.shape.index(BATCH)]} for a batch of {n}"
                        )
        else:
            for path, leaf in leaves_with_paths(outputs):
                if n is not None and (np.ndim(leaf) == 0 or np.shape(leaf)[0] != n):
                    bad.append(
                        f"{where} outputs: {path or '<root>'} is "
                        f"{_short(leaf)}, without the batch axis of size {n} in front"
                    )
        with contextlib.suppress(ValueError):  # outputs without a batch axis: reported above
            out_specs[case.name] = spec_of(outputs, dims={BATCH: 0})
        value = result.loss
        if np.shape(value) != () or not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            bad.append(f"{where} loss: {_short(value)} where a float scalar was expected")
        grads = result.grads
        found = mismatches(grads, pspec)
        grads_bad += len(found)
        bad += mismatch_lines(found, f"{where} grads", "the params", "the grads")
    distinct = {s.to_json() for s in out_specs.values()}
    if model.output_spec is None and len(distinct) > 1:
        names = ", ".join(f"{k}: {v!r}" for k, v in out_specs.items())
        bad.append(f"outputs differ in structure between cases: {names}")
    if out_specs:
        info.append(f"outputs {next(iter(out_specs.values()))!r} on {len(ctx.positive)} cases")
    if not grads_bad:
        info.append("grads match the params' spec")
    return _result(
        "contract",
        bad,
        "params, outputs, loss and grads match their contracts",
        f"{len(bad)} contract violation(s)",
        evidence=info,
    )


# -- 2. keys --------------------------------------------------------------------


def _key_programs(
    ctx: Context,
) -> list[tuple[str, Callable[..., Any], tuple[Any, ...], tuple[str, ...]]]:
    model = ctx.model
    out: list[tuple[str, Callable[..., Any], tuple[Any, ...], tuple[str, ...]]] = [
        ("init", model.init, (model.key(),), ("the key passed to init",))
    ]
    step = step_function(model)
    batch = ctx.batch(ctx.standard())
    if step is None:
        out.append(
            ("training step", jax.grad(model.loss), (ctx.params(), batch), ("params", "the batch"))
        )
    else:
        out.append(
            (
                "training step",
                step,
                (ctx.params(), ctx.programs.opt_state(), batch),
                ("params", "the optimizer state", "the batch"),
            )
        )
    return out


def check_keys(ctx: Context) -> CheckResult:
    """Each PRNG key is consumed once in ``init`` and in one training step.

    JAX's checker runs on each function traced under ``jit`` (it checks the
    traced program, so nothing is compiled), and treeguard's key streams
    evaluate only the operations keys flow through.
    """
    bad: list[str] = []
    info: list[str] = []
    programs = _key_programs(ctx)
    with jax.debug_key_reuse(True):
        for what, fn, args, _ in programs:
            try:
                jax.jit(lambda *a, f=fn: f(*a)).trace(*args)
            except jax.errors.KeyReuseError as e:
                first = str(e).splitlines()[0]
                bad.append(f"{what}: JAX's key-reuse checker: {first}")
    for what, fn, args, names in programs:
        trace = trace_keys(fn, *args, names=names, outputs=False)
        for r in trace.reuses:
            bad.append(f"{what}: {r.describe()}")
        for u in trace.unfollowed:
            info.append(f"{what}: key use inside {u} left to JAX's checker")
        info.append(f"{what}: {trace.consumed} key use(s), each key once")
    return _result(
        "keys",
        bad,
        "every PRNG key is used once (JAX's checker and treeguard's key streams)",
        f"{len(bad)} key reuse(s)",
        evidence=info,
    )


# -- 3. finite ------------------------------------------------------------------


def _non_finite(tree: Any) -> list[str]:
    """One line per leaf holding NaN or Inf: its path, summary, count and kinds."""
    counts = find_nonfinite(tree)
    if not counts:
        return []
    leaves = dict(leaves_with_paths(tree))
    out = []
    for path, n in counts.items():
        raw = np.asarray(leaves[path])
        nan, inf = host_nan_inf(raw)
        kinds = [k for k, has in (("nan", nan), ("inf", inf)) if has]
        out.append(
            f"{path or '<root>'} {summarize(raw.shape, raw.dtype)}: "
            f"{n} of {raw.size} non-finite ({'/'.join(kinds)})"
        )
    return out


def check_finite(ctx: Context) -> CheckResult:
    """The loss and every grad leaf are finite on every positive case."""
    bad: list[str] = []
    for case in ctx.positive:
        if ctx.programs.finite(case):  # counted in the compiled program itself
            continue
        result = ctx.programs.results(case)
        value, grads = result.loss, result.grads
        if _non_finite(value):
            bad.append(f"case {case.name!r} loss is non-finite: {float(value)}")
        for line in _non_finite(grads):
            bad.append(f"case {case.name!r} grads {line}")
    return _result(
        "finite",
        bad,
        f"loss and grads finite on {len(ctx.positive)} cases",
        f"non-finite loss or grads on {len({b.split(chr(39))[1] for b in bad})} case(s)",
    )


# -- 4. negative ----------------------------------------------------------------


def _names(types: tuple[type[BaseException], ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def check_negative(ctx: Context) -> CheckResult:
    """Each invalid input makes ``apply`` raise the expected exception."""
    params = ctx.params()
    bad: list[str] = []
    info: list[str] = []
    for case in ctx.negative:
        where = f"invalid case {case.name!r} ({case.note or case.summary()})"
        try:
            out = ctx.model.apply(params, case.batch)
            jax.block_until_ready(out)  # type: ignore[no-untyped-call]
        except case.raises as e:
            info.append(f"{where}: raised {type(e).__name__} as expected")
        except Exception as e:  # noqa: BLE001 - the wrong exception is the finding
            bad.append(
                f"{where}: raised {type(e).__name__} ({_first_line(e)}) instead of "
                f"{_names(case.raises)}; hint: if {type(e).__name__} is the refusal you "
                f"mean, declare it: {_declare(ctx.model, case, type(e))}"
            )
        else:
            bad.append(f"{where}: returned {_short(out)} instead of raising {_names(case.raises)}")
    if not ctx.negative:
        return CheckResult("negative", "skip", "no invalid inputs")
    return _result(
        "negative",
        bad,
        f"{len(ctx.negative)} invalid input(s) refused",
        f"{len(bad)} invalid input(s) not refused as expected",
        evidence=info,
    )


def _declare(model: Model, case: Case, raised: type[BaseException]) -> str:
    """The ``Model(...)`` argument that would accept ``raised`` for ``case``."""
    names = ", ".join(t.__name__ for t in (*case.raises, raised))
    if case.name == "invalid_shape" and tuple(model.invalid_raises) == case.raises:
        return f"Model(invalid_raises=({names}))"
    return f"InvalidInput({case.name!r}, ..., raises=({names}))"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 160 else line[:157] + "..."


# -- 5. transforms --------------------------------------------------------------


def check_transforms(ctx: Context) -> CheckResult:
    """Eager, ``jit`` and ``vmap`` agree on outputs, loss and grads within tolerance."""
    model = ctx.model
    tol = model.tolerance_policy
    programs = ctx.programs
    bad: list[str] = []
    rows: list[dict[str, Any]] = []
    worst: tuple[float, str] | None = None
    # Eager JAX compiles and dispatches each operation on its own, so the
    # eager reference runs on the standard case only; jit and vmap are
    # compared with each other on every case.
    eager_on = [ctx.standard()]
    for case in ctx.positive:
        eager = programs.eager(case) if case in eager_on else programs.results(case)
        variants = {"vmap": programs.vmapped(case)}
        if case in eager_on:
            variants = {"jit": programs.results(case), **variants}
        for vname, result in variants.items():
            for kind in ("outputs", "loss", "grads"):
                got, ref = getattr(result, kind), getattr(eager, kind)
                found, errs = compare_trees(got, ref, tolerance=tol)
                base = "eager" if case in eager_on else "jit"
                label = f"case {case.name!r} {kind}, {vname} vs {base}"
                bad += mismatch_lines(found, label, base, vname)
                for err in errs:
                    rows.append(
                        {"case": case.name, "kind": kind, "variant": vname, **err.to_dict()}
                    )
                    if not err.ok:
                        bad.append(f"{label}: {err.describe()}")
                    if worst is None or err.ratio > worst[0]:
                        worst = (err.ratio, f"{label}: {err.describe()}")
    info = [f"worst leaf: {worst[1]}"] if worst else []
    others = [c.name for c in ctx.positive if c not in eager_on]
    if others:
        info.append(f"cases {others}: vmap compared with jit (eager runs on the standard case)")
    if bad:
        bad, info = info + bad, []
    return _result(
        "transforms",
        bad,
        f"eager, jit and vmap agree on {len(ctx.positive)} cases",
        "eager, jit and vmap disagree beyond tolerance",
        evidence=info,
        rows=rows,
    )


# -- 6. environment -------------------------------------------------------------


def check_environment(ctx: Context) -> CheckResult:
    """Records the environment; fails if it differs from the references' in a way
    that invalidates them."""
    env = environment()
    info = [f"{k}: {v}" for k, v in env.items()]
    tol = ctx.model.tolerance_table()
    info.append(
        "tolerances: "
        + "; ".join(f"{k} rtol {v['rtol']:g} atol {v['atol']:g}" for k, v in tol.items())
    )
    rows: list[dict[str, Any]] = [{"key": k, "value": v, "recorded": None} for k, v in env.items()]
    refs = ctx.references
    if refs is None:
        info.append("no references to compare with")
        return CheckResult("environment", "pass", "environment recorded", info, rows)
    recorded = refs.environment
    if not recorded:
        return CheckResult(
            "environment",
            "fail",
            "the references record no environment",
            [f"{refs.path}: no environment fingerprint; hint: re-record with --record"],
            rows,
        )
    for row in rows:
        row["recorded"] = recorded.get(str(row["key"]))
    bad: list[str] = []
    for key, then, now in environment_diff(recorded, env):
        if key in INVALIDATING and ctx.record:
            info.append(
                f"{key}: {then!r} in the old references, {now!r} in this run; re-recording "
                "in this environment"
            )
        elif key in INVALIDATING:
            bad.append(
                f"{key}: {then!r} in the references, {now!r} in this run; the references were "
                f"computed with other {'dtypes' if key == 'x64' else 'arithmetic'}; hint: run with "
                f"{key} as recorded, or re-record with --record"
            )
        else:
            info.append(
                f"{key} differs: {then!r} in the references, {now!r} now (tolerated: compared at "
                "the declared tolerance)"
            )
    return _result(
        "environment",
        bad,
        "environment recorded; compatible with the references",
        "the environment invalidates the references",
        evidence=info,
        rows=rows,
    )


# -- 7. regression --------------------------------------------------------------


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
        return _result("regression", bad, matched, differ, rows=rows)
    where = f"references recorded on {refs.backend} ({refs.device_kind}), this run on {now}"
    if ctx.model.declares_backend(refs.backend) or ctx.model.declares_backend(now):
        at = f"{where}, at the declared cross-backend tolerance"
        return _result("regression", bad, f"{matched} ({at})", f"{differ} ({at})", rows=rows)
    return _result(
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


# -- 8. training ----------------------------------------------------------------


def check_training(ctx: Context) -> CheckResult:
    """A few training steps reduce the loss on the standard batch; the params,
    the optimizer's updates and the optimizer state keep their contracts."""
    model = ctx.model
    step = ctx.programs.step
    if not ctx.programs.trains:
        return CheckResult("training", "skip", "the model has no update and no optimizer")
    params = ctx.params()
    spec = spec_of(params)
    state = ctx.programs.opt_state()
    state_spec = spec_of(state) if state is not None else None
    batch = ctx.batch(ctx.standard())
    losses: list[float] = []
    bad: list[str] = []
    info: list[str] = []
    if state_spec is not None:
        info.append(
            f"optimizer state: {state_spec.num_leaves} leaves, {state_spec.num_params} values"
        )
    for i in range(1, model.training_steps + 1):
        out = step(params, state, batch)
        losses.append(float(out.loss))
        if out.updates is not None:
            found = mismatches(out.updates, spec)
            bad += mismatch_lines(
                found, f"step {i} updates", "the params", "the optimizer's updates"
            )
            if found:
                break
        params, state = out.params, out.opt_state
        found = mismatches(params, spec)
        bad += mismatch_lines(found, f"step {i} params", "init's params", "the updated params")
        if state_spec is not None:
            found_state = mismatches(state, state_spec)
            bad += mismatch_lines(
                found_state, f"step {i} optimizer state", "the initial state", "the updated state"
            )
            found = found + found_state
        if found:
            break
    if not bad:  # the loss after the last step (the next step's "before")
        losses.append(float(step(params, state, batch).loss))
    trail = " -> ".join(f"{v:.6g}" for v in losses)
    rows = [{"step": i, "loss": v} for i, v in enumerate(losses)]
    if not bad and not (np.isfinite(losses[-1]) and losses[-1] < losses[0]):
        bad.append(
            f"loss went {trail} over {len(losses) - 1} update step(s) on case "
            f"{ctx.standard().name!r}: it did not decrease; hint: check the sign and "
            "the step size of update"
        )
    return _result(
        "training",
        bad,
        f"loss {losses[0]:.6g} -> {losses[-1]:.6g} over {len(losses) - 1} steps; params "
        + ("and optimizer state keep their specs" if state_spec is not None else "keep their spec"),
        "training does not work",
        evidence=info if bad else [f"loss: {trail}", *info],
        rows=rows,
    )


# -- 9. splits ------------------------------------------------------------------


def example_hashes(data: Any, *, where: str = "the data") -> list[str]:
    """The sha256 of each example (index along axis 0 of every leaf), by content.

    Args:
      data: a tree of arrays, examples along axis 0.
      where: how a message names ``data`` (``"split 'val'"``).

    Raises:
      ValueError: if the leaves disagree on the number of examples, naming
        each leaf's path and count.

    Example:
      >>> h = example_hashes({"x": np.arange(6.0).reshape(3, 2)})
      >>> len(h), h[0] == example_hashes({"x": np.arange(2.0)[None]})[0]
      (3, True)
    """
    arrays = [(p, np.asarray(x)) for p, x in leaves_with_paths(data)]
    sizes = {a.shape[0] if a.ndim else None for _, a in arrays}
    if len(sizes) != 1 or None in sizes:
        counts = [
            f"{p or '<root>'} has {a.shape[0] if a.ndim else 'no axis 0 (a scalar)'}"
            for p, a in arrays[:LISTED]
        ]
        more = f", ... and {len(arrays) - LISTED} more" if len(arrays) > LISTED else ""
        raise ValueError(
            f"{where}: leaves disagree on the number of examples: {', '.join(counts)}{more}; "
            "hint: give every leaf the same number of rows along axis 0"
        )
    n = sizes.pop() or 0
    out = []
    for i in range(int(n)):
        h = hashlib.sha256()
        for path, a in arrays:
            row = np.ascontiguousarray(a[i])
            h.update(f"{path}|{row.dtype.name}|{row.shape}|".encode())
            h.update(row.tobytes())
        out.append(h.hexdigest())
    return out


def check_splits(ctx: Context) -> CheckResult:
    """No example appears in two of the model's data splits (by content hash)."""
    data = ctx.model.split_data()
    if data is None:
        return CheckResult("splits", "skip", "the model provides no data splits")
    seen: dict[str, tuple[str, int]] = {}
    bad: list[str] = []
    counts: dict[str, int] = {}
    overlaps = 0
    spec = ctx.model.batch_spec
    for split, tree in data.items():
        where = f"split {split!r}"
        found = mismatches(tree, spec)
        if found:
            bad += mismatch_lines(found, where, "the batch spec", "the split")
            bad.append(
                f"{where} does not match Model.batch_spec, so its examples were not compared; "
                "hint: give it the spec's dtypes and feature shapes, examples along axis 0"
            )
            continue
        try:
            hashes = example_hashes(tree, where=where)
        except ValueError as e:
            bad.append(str(e))
            continue
        counts[split] = len(hashes)
        for i, h in enumerate(hashes):
            prior = seen.get(h)
            if prior is not None and prior[0] != split:
                overlaps += 1
                if overlaps <= LISTED:
                    bad.append(
                        f"example {i} of {split!r} is example {prior[1]} of {prior[0]!r} "
                        f"(sha256 {h[:12]}...)"
                    )
            elif prior is None:
                seen[h] = (split, i)
    if overlaps > LISTED:
        bad.append(f"... and {overlaps - LISTED} more shared examples")
    sizes = ", ".join(f"{k} {v}" for k, v in counts.items())
    failed = f"{overlaps} example(s) appear in two splits ({sizes})"
    if len(counts) < len(data):
        failed = f"{len(data) - len(counts)} split(s) do not match the batch spec"
    return _result(
        "splits",
        bad,
        f"no example in two splits ({sizes})",
        failed,
        rows=[{"split": k, "examples": v} for k, v in counts.items()],
    )


# -- 10. performance: ``performance.check_performance`` -------------------------


RUNNERS: Mapping[str, Callable[[Context], CheckResult]] = {
    "contract": check_contract,
    "keys": check_keys,
    "finite": check_finite,
    "negative": check_negative,
    "transforms": check_transforms,
    "environment": check_environment,
    "regression": check_regression,
    "training": check_training,
    "splits": check_splits,
    "performance": check_performance,
}


def run_check(name: str, ctx: Context) -> CheckResult:
    """Runs one check; an unexpected exception fails it, with the exception as evidence."""
    start = time.perf_counter()
    try:
        result = RUNNERS[name](ctx)
    except Exception as e:  # noqa: BLE001 - any crash is this check's finding
        result = CheckResult(
            name,
            "fail",
            f"the check raised {type(e).__name__}",
            [f"{type(e).__name__}: {_first_line(e)}"],
        )
    result.seconds = time.perf_counter() - start
    return result
