"""The named checks of ``treeguard verify``.

Each check takes the shared ``Context`` and returns a ``CheckResult``: a
stable name, a status (``pass``, ``fail`` or ``skip``), a one-line summary,
evidence lines that name the cause, and structured rows for the reports.
A check that raises unexpectedly fails with the exception as its evidence.
"""

from __future__ import annotations

import contextlib
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
from ..nonfinite import find_nonfinite, host_nan_inf
from ..spec import TreeSpec, spec_of
from .cases import Case
from .compare import compare_trees, leaves_with_paths
from .context import CheckResult, Context, first_line, mismatch_lines, outcome
from .model import BATCH, Model
from .performance import check_performance
from .programs import step_function
from .regression import check_regression
from .splits import check_splits
from .training import check_training

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
    pspec = spec_of(params)
    bad, info = _params_contract(model, params, pspec)
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
        where = f"case {case.name!r}"
        n = _batch_size(ctx.batch(case), model.batch_spec)
        result = ctx.programs.results(case)
        outputs = result.outputs
        bad += _outputs_contract(model, outputs, n, where)
        with contextlib.suppress(ValueError):  # outputs without a batch axis: reported above
            out_specs[case.name] = spec_of(outputs, dims={BATCH: 0})
        value = result.loss
        if np.shape(value) != () or not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            bad.append(f"{where} loss: {_short(value)} where a float scalar was expected")
        found = mismatches(result.grads, pspec)
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
    return outcome(
        "contract",
        bad,
        "params, outputs, loss and grads match their contracts",
        f"{len(bad)} contract violation(s)",
        evidence=info,
    )


def _params_contract(model: Model, params: Any, pspec: TreeSpec) -> tuple[list[str], list[str]]:
    """``(violations, evidence)`` of the params against the stored params spec."""
    stored = model.stored_params_spec()
    if stored is None:
        return [], [
            f"params: {pspec.num_leaves} leaves, {pspec.num_params} values (no stored spec)"
        ]
    found = mismatches(params, stored)
    bad = mismatch_lines(found, "params", "the stored params spec", "init's params")
    if found:
        return bad, []
    return bad, [
        f"params match the stored spec ({pspec.num_leaves} leaves, {pspec.num_params} values)"
    ]


def _outputs_contract(model: Model, outputs: Any, n: int | None, where: str) -> list[str]:
    """The violations of one case's outputs: the output spec where the model
    declares one, else a leading batch axis of size ``n`` on every leaf."""
    bad: list[str] = []
    if model.output_spec is None:
        for path, leaf in leaves_with_paths(outputs):
            if n is not None and (np.ndim(leaf) == 0 or np.shape(leaf)[0] != n):
                bad.append(
                    f"{where} outputs: {path or '<root>'} is "
                    f"{_short(leaf)}, without the batch axis of size {n} in front"
                )
        return bad
    found = mismatches(outputs, model.output_spec)
    bad += mismatch_lines(found, f"{where} outputs", "the output spec", "apply's outputs")
    if not found and n is not None:
        for leaf, ls in zip(jax.tree.leaves(outputs), model.output_spec.leaves):
            if BATCH in ls.shape and leaf.shape[ls.shape.index(BATCH)] != n:
                bad.append(
                    f"{where} outputs: {ls.path or '<root>'} has batch size "
                    f"{leaf.shape[ls.shape.index(BATCH)]} for a batch of {n}"
                )
    return bad


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
    return outcome(
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
    return outcome(
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
                f"{where}: raised {type(e).__name__} ({first_line(e)}) instead of "
                f"{_names(case.raises)}; hint: if {type(e).__name__} is the refusal you "
                f"mean, declare it: {_declare(ctx.model, case, type(e))}"
            )
        else:
            bad.append(f"{where}: returned {_short(out)} instead of raising {_names(case.raises)}")
    if not ctx.negative:
        return CheckResult("negative", "skip", "no invalid inputs")
    return outcome(
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
    return outcome(
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
    return outcome(
        "environment",
        bad,
        "environment recorded; compatible with the references",
        "the environment invalidates the references",
        evidence=info,
        rows=rows,
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
            [f"{type(e).__name__}: {first_line(e)}"],
        )
    result.seconds = time.perf_counter() - start
    return result
