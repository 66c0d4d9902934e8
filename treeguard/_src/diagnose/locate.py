"""``locate``: the first jaxpr equation whose value differs between the eager
reference and a candidate (jit, vmap, grad, a matmul precision, a backend).

The search, in order:

1. Run the reference under ``jax.disable_jit()`` and the candidate, and
   compare every output leaf by key path.
2. Trace the candidate's program to a closed jaxpr and run it op by op (each
   equation dispatched alone). If that already differs from the reference,
   the traced program itself computes something else (a Python branch
   taken only while tracing, a batching rule): the divergence is in the
   trace, not in compilation.
3. Otherwise bisect over prefixes of the jaxpr: the candidate runs the
   first ``k`` equations and returns every value live at the cut, which is
   compared with the op-by-op run. The first ``k`` whose live values
   diverge is confirmed by running ``k - 1`` and ``k`` again; equation
   ``k - 1`` is the first that diverges.
4. Isolation: that equation alone, fed the reference's values of its
   inputs, under the candidate. Still diverging, it is the ``culprit``;
   clean alone, its divergence depends on what it was compiled with, and
   the result says it vanishes when cut rather than inventing a culprit.
5. Descend into the equation's body when it has one (``jit``, custom
   derivatives, the taken ``cond`` branch) and search again; for ``scan``
   and ``while``, find the first diverging iteration and the first body
   equation in it.
6. Re-run under ``jax.default_matmul_precision("highest")``: if the
   divergence is gone, the cause is matmul precision.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import numpy as np

from ..equation import site
from ..errors import DiagnosisError
from ..tolerance import TolerancePolicy
from ..verify.compare import LeafError, leaves_with_paths
from . import jaxpr as jx
from .candidates import CANDIDATES, Candidate, candidate_of, compiled, dispatched
from .divergence import (
    PROPAGATORS_LISTED,
    Backend,
    Divergence,
    Judge,
    Outcome,
    Role,
    Site,
    op_by_op,
)
from .tolerance import fp64_passes
from .trace import Trace, compare_trace

__all__ = ["CANDIDATES", "Candidate", "locate"]


def _values(env: dict[Any, Any], atoms: Sequence[Any]) -> list[Any]:
    return [jx.read(env, v) for v in atoms]


def _comparable(vs: Sequence[Any]) -> list[Any]:
    return [v for v in vs if jx.is_array(v.aval)]


def _site(eqn: Any, index: str, role: Role, errors: tuple[LeafError, ...], it: int | None) -> Site:
    source, stack = site(eqn)
    return Site(index, eqn.primitive.name, source, stack, role, it, errors, jx.eqn_text(eqn))


# -- the search -------------------------------------------------------------------


@dataclasses.dataclass
class _Found:
    site: Site
    enclosing: list[Site]
    k: int  # the top-level cut (equation index + 1)
    reproducible: bool = True


class _Search:
    def __init__(self, judge: Judge, notes: list[str], *, enter: bool = True) -> None:
        self.judge = judge
        self.notes = notes
        self.enter = enter

    def level(self, closed: Any, args: Sequence[Any], where: str) -> _Found | None:
        """The first diverging equation of one jaxpr level, descending into it."""
        j = closed.jaxpr
        ref = jx.interpret(closed, args)
        n = len(j.eqns)

        def diverges(k: int) -> bool:
            live = _comparable(jx.live_at(j, k))
            if not live:
                return False
            outs = self.judge.run(jx.prefix(closed, k, live), args)
            return any(self.judge.differs(o, ref.env[v]) for o, v in zip(outs, live))

        if n == 0 or not diverges(n):
            return None
        lo, hi = 0, n  # invariant: the cut at lo is clean, the cut at hi diverges
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if diverges(mid):
                hi = mid
            else:
                lo = mid
        reproducible = diverges(hi) and (hi == 1 or not diverges(hi - 1))
        if not reproducible:
            self.notes.append(
                f"{where or 'top level'}: the cut at {hi} gave another answer when run again"
            )
        eqn = j.eqns[hi - 1]
        index = f"{where}{hi - 1}"
        invals = _values(ref.env, eqn.invars)
        ref_outs = [ref.env[v] for v in eqn.outvars if not isinstance(v, jex.DropVar)]
        ins = jx.unique_vars(eqn.invars)
        alone_outs = self.judge.run(jx.alone(eqn), _values(ref.env, ins))
        errs = self.judge.errors(alone_outs, ref_outs)
        role: Role = "culprit" if any(not e.ok for e in errs) else "fused"
        if role == "fused":  # report the error it shows in context
            ctx_outs = self.judge.run(jx.prefix(closed, hi, _comparable(eqn.outvars)), args)
            errs = self.judge.errors(ctx_outs, [ref.env[v] for v in _comparable(eqn.outvars)])
        here = _site(eqn, index, role, errs, None)
        inner = self.descend(eqn, invals, index) if self.enter else None
        if inner is not None:
            inner.enclosing.insert(0, here)
            inner.k = hi
            inner.reproducible = inner.reproducible and reproducible
            return inner
        return _Found(here, [], hi, reproducible)

    def descend(self, eqn: Any, invals: list[Any], index: str) -> _Found | None:
        body = jx.body_of(eqn)
        if body is not None:
            n = len(body.jaxpr.invars)
            return self.level(body, invals[len(invals) - n :], f"{index}/")
        name = eqn.primitive.name
        if name == "cond":
            branches = eqn.params["branches"]
            b = int(np.clip(int(np.asarray(invals[0])), 0, len(branches) - 1))
            return self.level(branches[b], invals[1:], f"{index}/branch{b}/")
        if name in ("scan", "while"):
            return self.loop(jx.Loop.of(eqn, invals), index)
        return None

    def loop(self, loop: jx.Loop, index: str) -> _Found | None:
        """The first iteration, and the first body equation in it, that diverges."""
        _, runs = jx.run_loop(loop)
        if not runs:
            return None
        fn, fargs, extra = jx.loop_with_intermediates(loop)
        closed, _ = jx.as_closed(fn, *fargs)
        outs = self.judge.run(closed, jax.tree.leaves(fargs))
        body = loop.body.jaxpr
        owner = {v: (i, e) for i, e in enumerate(body.eqns) for v in e.outvars}
        first: tuple[int, int, Any] | None = None
        for v, stacked in zip(extra, outs):
            if not jx.is_array(v.aval):
                continue
            i_eqn, _ = owner[v]
            for it, r in enumerate(runs):
                if first is not None and (it, i_eqn) >= first[:2]:
                    break
                if self.judge.differs(stacked[it], r.env[v]):
                    first = (it, i_eqn, v)
                    break
        if first is None:
            self.notes.append(f"loop {index}: no iteration diverges when its body is cut out")
            return None
        it, i_eqn, _ = first
        eqn = body.eqns[i_eqn]
        ins = jx.unique_vars(eqn.invars)
        # Isolation in the iteration's context: the equation alone, iterated it + 1
        # times, fed the reference's inputs of every iteration up to it.
        xs = [jax.numpy.stack([runs[t].env[v] for t in range(it + 1)]) for v in ins]
        one = jex.jaxpr_as_fun(jx.alone(eqn))

        def iterate(xs: list[Any]) -> Any:
            return jax.lax.scan(lambda c, x: (c, list(one(*x))), None, xs)[1]

        iso_closed, _ = jx.as_closed(iterate, xs)
        iso = self.judge.run(iso_closed, xs)
        ref_outs = [runs[it].env[v] for v in eqn.outvars if not isinstance(v, jex.DropVar)]
        errs = self.judge.errors([o[it] for o in iso], ref_outs)
        role: Role = "culprit" if any(not e.ok for e in errs) else "fused"
        site = _site(eqn, f"{index}@{it}/{i_eqn}", role, errs, it)
        self.notes.append(f"loop {index}: first diverging iteration {it} of {len(runs)}")
        return _Found(site, [], 0)


def _reaches(j: Any, k: int, out_paths: list[str]) -> list[str]:
    """The output paths that depend on what equation ``k - 1`` defines."""
    tainted = {v for v in j.eqns[k - 1].outvars if not isinstance(v, jex.DropVar)}
    for e in j.eqns[k:]:
        if any(isinstance(v, jex.Var) and v in tainted for v in e.invars):
            tainted |= {v for v in e.outvars if not isinstance(v, jex.DropVar)}
    return [p for p, v in zip(out_paths, j.outvars) if isinstance(v, jex.Var) and v in tainted]


def _diverging_first(paths: list[str], leaves: Sequence[LeafError]) -> list[str]:
    """Of the reached paths, those whose leaves diverge (all of them if none does)."""
    bad = {e.path for e in leaves if not e.ok}
    hit = [p for p in paths if p in bad]
    return [p or "<root>" for p in (hit or paths)]


def _propagators(
    judge: Judge, closed: Any, args: Sequence[Any], k: int, env: dict[Any, Any]
) -> tuple[list[Site], int]:
    """Downstream top-level equations that diverge too, the first few isolated."""
    every, extra = jx.with_every_intermediate(closed)
    outs = judge.run(every, args)[len(closed.jaxpr.outvars) :]
    got = dict(zip(extra, outs))
    out: list[Site] = []
    count = 0
    for i, eqn in enumerate(closed.jaxpr.eqns[k:], start=k):
        vs = _comparable([v for v in eqn.outvars if not isinstance(v, jex.DropVar)])
        if not vs or not any(judge.differs(got[v], env[v]) for v in vs):
            continue
        count += 1
        if len(out) >= PROPAGATORS_LISTED:
            continue
        ins = jx.unique_vars(eqn.invars)
        alone = judge.run(jx.alone(eqn), _values(env, ins))
        iso = judge.errors(alone, [env[v] for v in vs])
        errs = judge.errors([got[v] for v in vs], [env[v] for v in vs])
        role: Role = "culprit" if any(not e.ok for e in iso) else "propagator"
        out.append(_site(eqn, str(i), role, errs, None))
    return out, count


# -- locate -----------------------------------------------------------------------


def _program(fn: Callable[..., Any], cand: Candidate) -> Callable[..., Any]:
    f = jax.grad(fn) if cand.grad else fn
    return jax.vmap(f) if cand.batched else f


def _reference(fn: Callable[..., Any], cand: Candidate, args: tuple[Any, ...]) -> Any:
    f = jax.grad(fn) if cand.grad else fn
    with jax.disable_jit():
        if not cand.batched:
            return f(*args)
        n = int(np.shape(jax.tree.leaves(args)[0])[0])
        each = [f(*jax.tree.map(lambda x, i=i: x[i], args)) for i in range(n)]
        return jax.tree.map(lambda *xs: jax.numpy.stack(xs), *each)


def _whole(
    fn: Callable[..., Any], cand: Candidate, args: tuple[Any, ...], closed: Any, judge: Judge
) -> Any:
    """The candidate's own call where it has one (``jax.jit(f)(*args)``), else
    its backend on the traced program."""
    program = _program(fn, cand)
    if cand.backend in (compiled, dispatched, op_by_op):
        judge.compiles += 1
    if cand.backend is compiled:
        return jax.jit(program)(*args)
    if cand.backend is dispatched or cand.backend is op_by_op:
        return program(*args)
    flat = judge.run(closed, jax.tree.leaves(args))
    return jax.tree.unflatten(jax.tree.structure(jax.eval_shape(program, *args)), flat)


def _leaf_errors(judge: Judge, got: Any, ref: Any) -> tuple[LeafError, ...]:
    g, r = leaves_with_paths(got), leaves_with_paths(ref)
    if [p for p, _ in g] != [p for p, _ in r]:
        raise DiagnosisError(
            f"the candidate's outputs have paths {[p for p, _ in g][:6]}, the reference's "
            f"{[p for p, _ in r][:6]}",
            hint="the structures differ, run the shapes stage first",
        )
    return tuple(judge.error(a, e, p) for (p, a), (_, e) in zip(g, r) if jx.is_array(e))


def locate(
    fn: Callable[..., Any],
    /,
    *args: Any,
    reference: str = "eager",
    candidate: str | Backend | Candidate | Any = "jit",
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: TolerancePolicy | None = None,
    descend: bool = True,
    check_precision: bool = True,
) -> Divergence:
    """Finds the first jaxpr equation whose value differs between the eager
    reference and a candidate.

    Args:
      fn: the function under test.
      *args: its arguments (pytrees of arrays).
      reference: ``"eager"``: ``fn`` under ``jax.disable_jit()``, each
        equation dispatched alone.
      candidate: ``"jit"``, ``"vmap"``, ``"jit+vmap"``, ``"grad"``,
        ``"jit+grad"``, a matmul precision (``"bfloat16"``: ``jit`` under
        ``jax.default_matmul_precision``), a recorded ``Trace``, or a
        backend ``(closed_jaxpr, flat_args) -> flat_outputs``.
      rtol: the default relative tolerance of float leaves.
      atol: the default absolute tolerance.
      tolerances: per-dtype and per-path rules, and the fp64 rule.
      descend: enter bodies (``jit``, custom derivatives, ``cond``, loops).
      check_precision: re-run under matmul precision ``highest`` to tell a
        precision effect.

    Returns:
      The ``Divergence``; its ``exit_code`` is 0 when nothing diverges, 1
      when an equation is located, 3 when cutting makes it vanish.

    Raises:
      DiagnosisError: for an unknown reference or candidate, or outputs of
        another structure.

    Example:
      >>> import jax.numpy as jnp
      >>> def f(x):
      ...     return jnp.sin(x) * 2.0
      >>> locate(f, jnp.ones(3)).outcome
      'none'
    """
    if isinstance(candidate, Trace):
        return compare_trace(fn, candidate, *args, rtol=rtol, atol=atol, tolerances=tolerances)
    if reference != "eager":
        raise DiagnosisError(f"unknown reference {reference!r}", hint="reference='eager'")
    started = time.perf_counter()
    cand = candidate_of(candidate)
    tols = TolerancePolicy.of(rtol=rtol, atol=atol, base=tolerances)
    judge = Judge(tols, cand.backend)
    closed, out_tree = jx.as_closed(_program(fn, cand), *args)
    ref_out = _reference(fn, cand, args)
    got = _whole(fn, cand, args, closed, judge)
    leaves = _leaf_errors(judge, got, ref_out)
    if tols.fp64 is not None and any(not e.ok for e in leaves):
        leaves = _apply_fp64(judge, fn, cand, args, got=got, ref=ref_out, leaves=leaves)
    run = _Run(fn, cand, args, judge, closed, out_tree, ref_out, got, leaves, started)
    if all(e.ok for e in leaves):
        return run.divergence(outcome="none", classification=None)
    return _search_divergence(run, descend=descend, check_precision=check_precision)


@dataclasses.dataclass
class _Run:
    """One ``locate`` call's program, reference, candidate outputs and judge."""

    fn: Callable[..., Any]
    cand: Candidate
    args: tuple[Any, ...]
    judge: Judge
    closed: Any
    out_tree: Any
    ref_out: Any
    got: Any
    leaves: tuple[LeafError, ...]
    started: float

    def divergence(self, **fields: Any) -> Divergence:
        """The result, with what every outcome carries."""
        return Divergence(
            reference="eager, per example" if self.cand.batched else "eager",
            candidate=self.cand.name,
            leaves=self.leaves,
            n_equations=len(self.closed.jaxpr.eqns),
            tolerances=self.judge.tolerances.to_dict(),
            compiles=self.judge.compiles,
            seconds=time.perf_counter() - self.started,
            **fields,
        )


def _search_divergence(run: _Run, *, descend: bool, check_precision: bool) -> Divergence:
    """Tells a trace divergence from a compiled one and searches for the
    equation where the outputs diverge."""
    judge, cand, closed = run.judge, run.cand, run.closed
    flat = jax.tree.leaves(run.args)
    notes: list[str] = []
    taped = jax.tree.unflatten(run.out_tree, op_by_op(closed, flat))
    trace_differs = any(not e.ok for e in _leaf_errors(judge, taped, run.ref_out))
    compile_differs = any(not e.ok for e in _leaf_errors(judge, run.got, taped))
    precision = _precision_check(run.fn, cand, run.args, judge) if check_precision else False
    found: _Found | None = None
    if compile_differs:
        found = _Search(judge, notes, enter=descend).level(closed, flat, "")
    if trace_differs:
        notes.append(
            "the traced program differs from the eager run already when run op by op: "
            + (
                "the batched program computes something else than each example alone"
                if cand.batched
                else "a Python branch taken only while tracing, or a value read at trace time"
            )
        )
        notes += _narrowing_casts(closed)
    culprit = found is not None and found.site.role == "culprit"
    if trace_differs and not culprit:
        if found is not None:
            notes.append(
                f"besides, equation {found.site.index} ({found.site.primitive}) at "
                f"{found.site.source} differs compiled from op by op, but not alone"
            )
        return run.divergence(
            outcome="trace",
            classification="batching" if cand.batched else "trace",
            notes=tuple(notes),
        )
    if found is None:
        notes.append(
            "the outputs diverge, but no cut of the program does: the divergence depends on "
            "how the whole program is compiled (fusion), so no equation is blamed"
        )
        return run.divergence(
            outcome="vanishes",
            classification="precision" if precision else "fusion",
            notes=tuple(notes),
        )
    return _located(run, found, notes, trace_differs=trace_differs, precision=precision)


def _located(
    run: _Run, found: _Found, notes: list[str], *, trace_differs: bool, precision: bool
) -> Divergence:
    """The result naming the equation found, its propagators and the outputs
    it reaches."""
    closed, flat = run.closed, jax.tree.leaves(run.args)
    ref_env = jx.interpret(closed, flat).env
    props, count = _propagators(run.judge, closed, flat, found.k, ref_env)
    if count > len(props):
        notes.append(f"{count} downstream equations diverge; the first {len(props)} are listed")
    outcome: Outcome = "vanishes" if found.site.role == "fused" else "located"
    if outcome == "vanishes":
        notes.append(
            f"equation {found.site.index} diverges in its prefix but not alone on the "
            "reference's inputs: the divergence depends on fusion, so it is not named a culprit"
        )
    if precision:
        notes.append('the divergence is gone under jax.default_matmul_precision("highest")')
    classification = "precision" if precision else ("fusion" if outcome == "vanishes" else None)
    out_paths = [p for p, _ in leaves_with_paths(run.ref_out)]
    return run.divergence(
        outcome=outcome,
        classification=classification or ("trace" if trace_differs else "compilation"),
        equation=found.site,
        enclosing=tuple(found.enclosing),
        propagators=tuple(props),
        reaches=tuple(_diverging_first(_reaches(closed.jaxpr, found.k, out_paths), run.leaves)),
        notes=tuple(notes),
        reproducible=found.reproducible,
    )


def _narrowing_casts(closed: Any) -> list[str]:
    """Notes naming the casts to a narrower float type in the traced program:
    the usual suspects when the trace computes something else than eager."""
    out: list[str] = []

    def hook(eqn: Any, invals: list[Any], outs: list[Any], where: str, stack: str) -> None:
        if eqn.primitive.name != "convert_element_type":
            return
        src, dst = np.dtype(eqn.invars[0].aval.dtype), np.dtype(eqn.outvars[0].aval.dtype)
        if src.kind == "f" and dst.kind in "fV" and dst.itemsize < src.itemsize:
            out.append(
                f"the traced program casts {src.name} to {dst.name} at equation {where}, "
                f"{site(eqn)[0]}"
            )

    jx.walk(closed, hook)
    return out[:PROPAGATORS_LISTED]


def _precision_check(
    fn: Callable[..., Any], cand: Candidate, args: tuple[Any, ...], judge: Judge
) -> bool:
    """Whether the divergence is gone with every matmul at precision ``highest``."""
    if cand.name.endswith("@highest"):
        return False
    with jax.default_matmul_precision("highest"):
        ref = _reference(fn, cand, args)
        closed, _ = jx.as_closed(_program(fn, cand), *args)
        got = _whole(fn, cand, args, closed, judge)
        return all(e.ok for e in _leaf_errors(judge, got, ref))


def _apply_fp64(
    judge: Judge,
    fn: Callable[..., Any],
    cand: Candidate,
    args: tuple[Any, ...],
    *,
    got: Any,
    ref: Any,
    leaves: tuple[LeafError, ...],
) -> tuple[LeafError, ...]:
    """Leaves beyond tolerance that pass the fp64-relative rule count as within it."""
    multiplier = judge.tolerances.fp64
    assert multiplier is not None
    with jax.enable_x64(True):
        wide = jax.tree.map(
            lambda x: np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else x, args
        )
        ref64 = _reference(fn, cand, wide)
    r64 = dict(leaves_with_paths(ref64))
    g, r = dict(leaves_with_paths(got)), dict(leaves_with_paths(ref))

    def judged(e: LeafError) -> LeafError:
        if e.ok or e.path not in r64:
            return e
        if fp64_passes(g[e.path], r[e.path], r64[e.path], e.tolerance, multiplier):
            return dataclasses.replace(e, bad=0)
        return e

    return tuple(judged(e) for e in leaves)
