"""The stage ladder: localise a divergence stage by stage on a verify ``Model``.

The stages run in order and stop at the first that fails:

1. ``data``: each case's content hash, and every batch finite;
2. ``keys``: each PRNG key consumed once (verify's key-stream checker);
3. ``shapes``: ``jax.eval_shape`` of params, outputs, loss, grads and one
   update against their contracts: a dtype or weak_type change is caught
   here, before any number is compared;
4. ``forward``, ``loss``, ``grads``, ``update``: eager against the stored
   references (one update must keep the loss from rising);
5. ``jit``, ``vmap``, ``grad``: one transformation at a time against eager.

A failing numeric stage goes down to leaf level (every leaf's error by key
path) and then to equation level: ``locate`` for a transformation,
``nan_origin`` for a non-finite value.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ..diff import mismatches
from ..env import environment
from ..errors import ConfigError
from ..leaf import summarize
from ..mismatch import Mismatch
from ..nonfinite import find_nonfinite
from ..spec import spec_of
from ..tolerance import Tolerance, TolerancePolicy
from ..verify import refs as refs_mod
from ..verify.cases import Case, generate_cases
from ..verify.checks import check_keys
from ..verify.compare import LeafError, compare_trees
from ..verify.context import Context
from ..verify.model import Model
from ..verify.programs import per_example_apply
from ..verify.regression import regression_errors
from ..verify.splits import example_hashes
from .divergence import Divergence
from .locate import locate
from .nan import nan_origin
from .report import Diagnosis, StageResult
from .trace import Trace, compare_trace, load_trace, record_trace

#: The stages, in the order they run; the names are part of the interface.
STAGES: tuple[str, ...] = (
    "data",
    "keys",
    "shapes",
    "forward",
    "loss",
    "grads",
    "update",
    "jit",
    "vmap",
    "grad",
)

_LISTED = 12


def _case_hash(case: Case) -> str:
    try:
        parts = example_hashes(case.batch)
    except ValueError:
        parts = []
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
    return h.hexdigest()


def _mismatch_lines(found: list[Mismatch], where: str, exp: str, act: str) -> list[str]:
    out = [f"{where}: {m.describe(exp, act)}" for m in found[:_LISTED]]
    if len(found) > _LISTED:
        out.append(f"{where}: ... and {len(found) - _LISTED} more")
    return out


class _Ladder:
    def __init__(self, model: Model, references: Path | None, tolerances: TolerancePolicy) -> None:
        self.model = model
        self.tolerances = tolerances
        loaded = None
        if references is not None and references.exists():
            loaded = refs_mod.load_references(
                references, exceptions=refs_mod.declared_exceptions(model)
            )
        self.refs = loaded
        cases = list(loaded.cases) if loaded is not None else generate_cases(model)
        self.ctx = Context(model=model, cases=cases, references=loaded)

    # -- 1. data ---------------------------------------------------------------

    def data(self) -> StageResult:
        bad: list[str] = []
        info: list[str] = []
        fresh = {c.name: _case_hash(c) for c in generate_cases(self.model)} if self.refs else {}
        for case in self.ctx.positive:
            digest = _case_hash(case)
            info.append(f"case {case.name!r} ({case.summary()}): sha256 {digest[:16]}")
            if case.name in fresh and fresh[case.name] != digest:
                info.append(
                    f"case {case.name!r}: the stored case differs from a freshly generated one "
                    f"(sha256 {fresh[case.name][:16]}); the stored one is used"
                )
            for path, n in find_nonfinite(case.batch).items():
                bad.append(f"case {case.name!r} batch {path or '<root>'}: {n} non-finite values")
        return _stage("data", bad, f"{len(self.ctx.positive)} cases hashed, all finite", info)

    # -- 2. keys ---------------------------------------------------------------

    def keys(self) -> StageResult:
        r = check_keys(self.ctx)
        return StageResult("keys", r.status, r.summary, list(r.evidence))

    # -- 3. shapes -------------------------------------------------------------

    def shapes(self) -> StageResult:
        model = self.model
        bad: list[str] = []
        info: list[str] = []
        params = jax.eval_shape(model.init, model.key())
        stored = model.stored_params_spec()
        if stored is not None:
            bad += _mismatch_lines(
                [m for m in mismatches(params, stored) if m.kind != "weak_type"],
                "params",
                "the stored params spec",
                "eval_shape(init)",
            )
        pspec = spec_of(params)
        info.append(f"params: {pspec.num_leaves} leaves ({pspec.num_params} values)")
        batch = self.ctx.batch(self.ctx.standard())
        outputs = jax.eval_shape(model.apply, params, batch)
        if model.output_spec is not None:
            bad += _mismatch_lines(
                mismatches(outputs, model.output_spec),
                "outputs",
                "the output spec",
                "eval_shape(apply)",
            )
        if self.refs is not None:
            exp = self.refs.expected.get(self.ctx.standard().name)
            if exp is not None:
                bad += _mismatch_lines(
                    [m for m in mismatches(outputs, spec_of(exp.outputs)) if m.kind != "weak_type"],
                    "outputs",
                    "the references",
                    "eval_shape(apply)",
                )
        loss = jax.eval_shape(model.loss, params, batch)
        if loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
            bad.append(
                f"loss: {_summary(loss)} from eval_shape(loss), where a float scalar was expected"
            )
        grads = jax.eval_shape(jax.grad(model.loss), params, batch)
        bad += _mismatch_lines(mismatches(grads, pspec), "grads", "the params", "eval_shape(grad)")
        if model.update is not None:
            new = jax.eval_shape(model.update, params, grads)
            bad += _mismatch_lines(
                mismatches(new, pspec), "updated params", "the params", "eval_shape(update)"
            )
        jitted = jax.eval_shape(jax.jit(model.apply), params, batch)
        bad += _mismatch_lines(
            mismatches(jitted, spec_of(outputs)), "jit outputs", "eval_shape(apply)", "under jit"
        )
        return _stage(
            "shapes",
            bad,
            "params, outputs, loss, grads and update have their contracts' shapes and dtypes",
            info,
        )

    # -- 4. against the references -------------------------------------------------

    def _regression(self) -> tuple[list[str], list[dict[str, Any]]]:
        if not hasattr(self, "_reg"):
            assert self.refs is not None
            # the forward stage is the eager one: verify's programs run op by op here
            with jax.disable_jit():
                self._reg = regression_errors(self.ctx, self.refs)
        return self._reg

    def _against_refs(
        self, name: str, kinds: tuple[str, ...], labels: tuple[str, ...]
    ) -> StageResult:
        if self.refs is None:
            return StageResult(name, "skip", "no references to compare with")
        lines, rows = self._regression()
        bad = [ln for ln in lines if any(_labelled(ln, lab) for lab in labels)]
        leaves = [_row_error(r) for r in rows if r["kind"] in kinds]
        worst = [e for e in leaves if not e.ok]
        return _stage(
            name,
            bad,
            f"{' and '.join(kinds)} match{'es' if kinds == ('loss',) else ''} the references on "
            f"{len(self.ctx.positive)} cases",
            [],
            leaves=worst or leaves[:_LISTED],
        )

    def forward(self) -> StageResult:
        return self._against_refs("forward", ("params", "outputs"), ("params", "outputs"))

    def loss(self) -> StageResult:
        r = self._against_refs("loss", ("loss",), ("loss",))
        return self._finite(r, grad=False)

    def grads(self) -> StageResult:
        r = self._against_refs("grads", ("grads",), ("grads",))
        return self._finite(r, grad=True)

    def _finite(self, r: StageResult, *, grad: bool) -> StageResult:
        """Fails the stage on a non-finite loss (or grads), with where it is born."""
        model = self.model
        params = self.ctx.params()
        for case in self.ctx.positive:
            batch = self.ctx.batch(case)
            value = jax.grad(model.loss)(params, batch) if grad else model.loss(params, batch)
            found = find_nonfinite(value)
            if not found:
                continue
            what = "grads" if grad else "loss"
            lines = [
                f"case {case.name!r} {what} {p or '<root>'}: {n} non-finite values"
                for p, n in list(found.items())[:_LISTED]
            ]
            sites = nan_origin(model.loss, params, batch, grad=grad)
            lines += [f"born at {s.describe()}" for s in sites[:_LISTED]]
            return StageResult(
                r.name,
                "fail",
                f"non-finite {what} on case {case.name!r}",
                [*lines, *r.evidence],
                r.leaves,
                nan_sites=sites,
            )
        return r

    def update(self) -> StageResult:
        model = self.model
        update = model.update
        if update is None:
            return StageResult("update", "skip", "the model has no update")
        params = self.ctx.params()
        case = self.ctx.standard()
        batch = self.ctx.batch(case)
        before, grads = jax.value_and_grad(model.loss)(params, batch)
        new = update(params, grads)
        bad: list[str] = []
        found = find_nonfinite(new)
        for p, n in list(found.items())[:_LISTED]:
            bad.append(f"updated params {p or '<root>'}: {n} non-finite values")
        after = model.loss(new, batch)
        if not bad and not float(after) <= float(before):
            bad.append(
                f"loss went {float(before):.6g} -> {float(after):.6g} after one update step on "
                f"case {case.name!r}: it rose; hint: check the sign and the step size of update"
            )
        stage = _stage(
            "update",
            bad,
            f"one update step: loss {float(before):.6g} -> {float(after):.6g}, params finite",
            [],
        )
        if found:
            stage.nan_sites = nan_origin(lambda p: update(p, grads), params)
        return stage

    # -- 5. transformations ------------------------------------------------------

    def _transform(
        self,
        name: str,
        pairs: Callable[[Any, Any], list[tuple[str, Any, Any, Callable[[], Divergence]]]],
    ) -> StageResult:
        params = self.ctx.params()
        bad: list[str] = []
        leaves: list[LeafError] = []
        tol = self.tolerances
        for case in self.ctx.positive:
            batch = self.ctx.batch(case)
            for kind, got, ref, search in pairs(params, batch):
                found, errs = compare_trees(got, ref, tolerance=tol)
                label = f"case {case.name!r} {kind}, {name} vs eager"
                bad += _mismatch_lines(found, label, "eager", name)
                wrong = [e for e in errs if not e.ok]
                leaves += errs
                if wrong or found:
                    bad += [f"{label}: {e.describe()}" for e in wrong[:_LISTED]]
                    div = search()
                    if div.equation is not None:
                        bad.append(f"{label}: first diverging {div.equation.describe()}")
                    return StageResult(
                        name,
                        "fail",
                        f"{name} differs from eager on case {case.name!r} {kind}",
                        bad,
                        wrong,
                        div,
                    )
        return _stage(name, bad, f"{name} agrees with eager on {len(self.ctx.positive)} cases", [])

    def _locate(self, fn: Callable[..., Any], *args: Any, candidate: str) -> Divergence:
        return locate(fn, *args, candidate=candidate, tolerances=self.tolerances)

    def jit(self) -> StageResult:
        model = self.model

        def pairs(p: Any, b: Any) -> list[tuple[str, Any, Any, Callable[[], Divergence]]]:
            with jax.disable_jit():
                out, value = model.apply(p, b), model.loss(p, b)
            return [
                (
                    "outputs",
                    jax.jit(model.apply)(p, b),
                    out,
                    lambda: self._locate(model.apply, p, b, candidate="jit"),
                ),
                (
                    "loss",
                    jax.jit(model.loss)(p, b),
                    value,
                    lambda: self._locate(model.loss, p, b, candidate="jit"),
                ),
            ]

        return self._transform("jit", pairs)

    def vmap(self) -> StageResult:
        model = self.model

        def pairs(p: Any, b: Any) -> list[tuple[str, Any, Any, Callable[[], Divergence]]]:
            with jax.disable_jit():
                out = model.apply(p, b)

            def one(example: Any) -> Any:
                return model.apply(p, jax.tree.map(lambda x: x[None], example))

            return [
                (
                    "outputs",
                    per_example_apply(model, p, b),
                    out,
                    lambda: self._locate(one, b, candidate="vmap"),
                ),
            ]

        return self._transform("vmap", pairs)

    def grad(self) -> StageResult:
        model = self.model

        def pairs(p: Any, b: Any) -> list[tuple[str, Any, Any, Callable[[], Divergence]]]:
            with jax.disable_jit():
                g = jax.grad(model.loss)(p, b)
            return [
                (
                    "grads",
                    jax.jit(jax.grad(model.loss))(p, b),
                    g,
                    lambda: self._locate(model.loss, p, b, candidate="jit+grad"),
                ),
            ]

        return self._transform("grad", pairs)

    # -- traces --------------------------------------------------------------------

    def step_fn(self) -> tuple[Callable[..., Any], Any, Any]:
        """What a trace records: ``value_and_grad(loss)`` on the standard case."""
        return (
            jax.value_and_grad(self.model.loss),
            self.ctx.params(),
            self.ctx.batch(self.ctx.standard()),
        )

    def against(self, trace: Trace) -> StageResult:
        fn, params, batch = self.step_fn()
        div = compare_trace(fn, trace, params, batch, tolerances=self.tolerances)
        evidence = [n for n in div.notes if n.startswith("environment:")]
        if div.equation is not None:
            evidence.append(f"first differing {div.equation.describe()}")
        evidence += [n for n in div.notes if not n.startswith("environment:")]
        if not div.diverged:
            return StageResult(
                "trace",
                "pass",
                f"every equation matches {trace.path.name}",
                evidence,
                list(div.leaves),
                div,
            )
        return StageResult(
            "trace",
            "fail",
            f"this run differs from {trace.path.name}",
            evidence,
            [e for e in div.leaves if not e.ok],
            div,
        )


def _summary(x: Any) -> str:
    return summarize(tuple(x.shape), x.dtype)


def _labelled(line: str, label: str) -> bool:
    head = line.split(":", 1)[0]
    return head == label or head.endswith(f" {label}")


def _row_error(row: dict[str, Any]) -> LeafError:
    def num(x: Any) -> float:
        return float(x) if not isinstance(x, str) else float(x.replace("inf", "inf"))

    path = row["path"]
    where = (
        f"{row['kind']} {path}"
        if row["case"] == "-"
        else f"case {row['case']!r} {row['kind']} {path}"
    )
    return LeafError(
        where.strip(),
        row["summary"],
        num(row["max_abs"]),
        num(row["max_rel"]),
        num(row["ratio"]),
        Tolerance(row["rtol"], row["atol"]),
        int(row["bad"]),
        int(row["size"]),
    )


def _stage(
    name: str, bad: list[str], ok: str, info: list[str], *, leaves: list[LeafError] | None = None
) -> StageResult:
    if bad:
        return StageResult(
            name, "fail", f"{len(bad)} problem(s)", [*bad, *info], list(leaves or [])
        )
    return StageResult(name, "pass", ok, info, list(leaves or []))


def diagnose(
    model: Model,
    /,
    *,
    references: str | os.PathLike[str] | None = None,
    record: str | os.PathLike[str] | None = None,
    against: str | os.PathLike[str] | Trace | None = None,
    tolerances: TolerancePolicy | None = None,
    stages: tuple[str, ...] = STAGES,
    name: str | None = None,
) -> Diagnosis:
    """Runs the stage ladder on a verify ``Model``, stopping at the first failing stage.

    Args:
      model: the ``Model``.
      references: the references file, instead of ``model.references``;
        without references the ``forward``, ``loss`` and ``grads`` stages
        only check finiteness.
      record: write a trace of ``value_and_grad(loss)`` on the standard case
        (inputs and every intermediate, op by op) to this file.
      against: compare this machine's run of the same step with a recorded
        trace, equation by equation, instead of running the ladder.
      tolerances: the tolerances; the model's own by default.
      stages: which stages to run, in ``STAGES`` order.
      name: how reports name the model.

    Returns:
      The ``Diagnosis``; ``exit_code`` is 0 when nothing fails.

    Raises:
      ConfigError: for an unknown stage, or a model that is no ``Model``.
      FormatError: for an unreadable references or trace file.
      DiagnosisError: for a trace of another program.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> d = diagnose(model, stages=("data", "shapes"))
      >>> [(s.name, s.status) for s in d.stages], d.exit_code
      ([('data', 'pass'), ('shapes', 'pass')], 0)
    """
    if not isinstance(model, Model):
        raise ConfigError(f"expected a treeguard.verify.Model, got {type(model).__name__}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ConfigError(f"unknown stage(s) {unknown}", hint=f"choose from {', '.join(STAGES)}")
    started = time.perf_counter()
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    ref_path = references if references is not None else model.references
    tols = tolerances or model.tolerance_policy
    ladder = _Ladder(model, Path(ref_path) if ref_path is not None else None, tols)
    results: list[StageResult] = []
    if against is not None:
        trace = against if isinstance(against, Trace) else load_trace(against)
        t0 = time.perf_counter()
        r = ladder.against(trace)
        r.seconds = time.perf_counter() - t0
        results.append(r)
    else:
        failed = False
        for stage in STAGES:
            if stage not in stages:
                continue
            if failed:
                results.append(StageResult(stage, "skip", "not run: an earlier stage failed"))
                continue
            t0 = time.perf_counter()
            r = getattr(ladder, stage)()
            r.seconds = time.perf_counter() - t0
            results.append(r)
            failed = r.status == "fail"
    recorded = None
    if record is not None:
        fn, params, batch = ladder.step_fn()
        recorded = str(
            record_trace(
                record, fn, params, batch, label=f"value_and_grad(loss) of {name or model.name}"
            )
        )
    return Diagnosis(
        model=name or model.name,
        stages=results,
        environment=environment(),
        tolerances=tols.to_dict(),
        recorded=recorded,
        created=created,
        seconds=time.perf_counter() - started,
    )
