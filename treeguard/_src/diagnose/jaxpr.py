"""Reading, running and cutting closed jaxprs, one equation at a time.

Everything ``locate``, ``nan_origin`` and the recorded traces need from a
jaxpr lives here: the source line of an equation, an interpreter that runs a
jaxpr op by op and keeps every intermediate value (descending into calls,
conds, scans and while loops), the variables live at a cut, and the
programs built from a cut: a prefix that stops after ``k`` equations, one
equation alone, a loop body that returns every intermediate of every
iteration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.extend.source_info_util as jsi
import numpy as np

from ..equation import CALLS, bind
from ..leaf import summarize


def eqn_text(eqn: Any, limit: int = 100) -> str:
    """The equation as ``sin(f32[5]) -> f32[5]``: its primitive and the types
    of its inputs and outputs, capped at ``limit`` characters."""
    ins = ", ".join(_aval_text(v.aval) for v in eqn.invars)
    outs = ", ".join(_aval_text(v.aval) for v in eqn.outvars)
    text = f"{eqn.primitive.name}({ins}) -> {outs}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _aval_text(aval: Any) -> str:
    if not hasattr(aval, "shape") or not hasattr(aval, "dtype"):
        return str(aval)
    try:
        return summarize(tuple(aval.shape), aval.dtype)
    except (TypeError, ValueError):
        return str(aval)


def is_array(aval: Any) -> bool:
    """Whether a value of this abstract type can be compared (a numeric array)."""
    dtype = getattr(aval, "dtype", None)
    if dtype is None or not hasattr(aval, "shape"):
        return False
    return not jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)


def has_body(eqn: Any) -> bool:
    """Whether the equation runs sub-jaxprs (a call, a cond, a loop)."""
    return body_of(eqn) is not None or eqn.primitive.name in ("cond", "scan", "while")


def body_of(eqn: Any) -> Any | None:
    """The closed body of a call-like equation (``jit``, custom derivatives), or None."""
    key = CALLS.get(eqn.primitive.name)
    if key is None or key not in eqn.params:
        return None
    body = eqn.params[key]
    return body if isinstance(body, jex.ClosedJaxpr) else jex.ClosedJaxpr(body, ())


def read(env: dict[Any, Any], v: Any) -> Any:
    return v.val if isinstance(v, jex.Literal) else env[v]


def scan_split(params: Any) -> tuple[int, int]:
    """How many of a ``scan`` equation's inputs are constants and carry.

    JAX has no public accessor for this. Up to 0.10 the equation holds
    ``num_consts``/``num_carry``; from 0.11 it holds ``ft_in``, a tree of its
    inputs grouped as (consts, carry, xs), whose ``elts`` are the groups.
    tests/diagnose/test_jaxpr.py fails loudly if neither form is there.
    """
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    groups = params["ft_in"].elts
    return len(list(groups[0])), len(list(groups[1]))


@dataclasses.dataclass
class Run:
    """What an op-by-op run kept: every variable's value at one jaxpr level.

    Attributes:
      env: each variable (inputs, constants, every equation's outputs) to
        its value.
      outputs: the jaxpr's outputs.
    """

    env: dict[Any, Any]
    outputs: list[Any]


#: Called after each equation of an interpreted jaxpr with ``(eqn, invals,
#: outvals, where, stack)``; ``where`` names the nesting (``"3/0@5/2"``), and
#: ``stack`` joins the name stacks of the equation and those it sits in.
Hook = Callable[[Any, list[Any], list[Any], str, str], None]


def interpret(
    closed: Any,
    args: Sequence[Any],
    *,
    hook: Hook | None = None,
    where: str = "",
    stack: str = "",
) -> Run:
    """Runs a closed jaxpr equation by equation, each equation dispatched alone.

    Calls, conds, scans and while loops are entered and run op by op too
    (a loop in Python, iteration by iteration), so no two primitives are
    ever compiled together: this is the eager reference.

    Args:
      closed: a ``ClosedJaxpr``.
      args: one concrete value per input variable.
      hook: called after every equation, at every depth.
      where: a prefix for the hook's nesting label.

    Returns:
      The ``Run`` of the top level.
    """
    jaxpr = closed.jaxpr
    env: dict[Any, Any] = {}
    for v, x in zip(jaxpr.constvars, closed.consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for i, eqn in enumerate(jaxpr.eqns):
        invals = [read(env, v) for v in eqn.invars]
        label = f"{where}{i}"
        own = str(eqn.source_info.name_stack) if hook is not None else ""
        full = "/".join(s for s in (stack, own) if s)
        outs = run_eqn(eqn, invals, hook=hook, where=label, stack=full)
        if hook is not None:
            hook(eqn, invals, outs, label, full)
        for v, x in zip(eqn.outvars, outs):
            if not isinstance(v, jex.DropVar):
                env[v] = x
    return Run(env, [read(env, v) for v in jaxpr.outvars])


def run_eqn(
    eqn: Any, invals: list[Any], *, hook: Hook | None = None, where: str = "", stack: str = ""
) -> list[Any]:
    """One equation op by op: entering its body if it has one, else one dispatch."""
    name = eqn.primitive.name
    body = body_of(eqn)
    if body is not None:
        n = len(body.jaxpr.invars)
        args = invals[len(invals) - n :]
        return interpret(body, args, hook=hook, where=f"{where}/", stack=stack).outputs
    if name == "cond":
        branches = eqn.params["branches"]
        index = int(np.clip(int(np.asarray(invals[0])), 0, len(branches) - 1))
        here = f"{where}/branch{index}/"
        return interpret(branches[index], invals[1:], hook=hook, where=here, stack=stack).outputs
    if name in ("scan", "while"):
        return run_loop(Loop.of(eqn, invals), hook=hook, where=where, stack=stack)[0]
    return bind(eqn, invals)


@dataclasses.dataclass
class Loop:
    """A ``scan`` or ``while`` equation seen as one loop: ``body(consts, carry,
    xs) -> (carry, ys)``, with a known trip count.

    A while loop's trip count is only known by running it; ``length`` is
    None until ``run_loop`` has run it.
    """

    eqn: Any
    body: Any
    consts: list[Any]
    init: list[Any]
    xs: list[Any]
    n_carry: int
    length: int | None
    reverse: bool
    cond: Any = None
    cond_consts: list[Any] = dataclasses.field(default_factory=list)

    @staticmethod
    def of(eqn: Any, invals: list[Any]) -> Loop:
        p = eqn.params
        if eqn.primitive.name == "scan":
            nc, nk = scan_split(p)
            return Loop(
                eqn,
                p["jaxpr"],
                list(invals[:nc]),
                list(invals[nc : nc + nk]),
                list(invals[nc + nk :]),
                nk,
                int(p["length"]),
                bool(p["reverse"]),
            )
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        return Loop(
            eqn,
            p["body_jaxpr"],
            list(invals[cn : cn + bn]),
            list(invals[cn + bn :]),
            [],
            len(invals) - cn - bn,
            None,
            False,
            cond=p["cond_jaxpr"],
            cond_consts=list(invals[:cn]),
        )

    def finish(self, carry: list[Any], ys: list[list[Any]]) -> list[Any]:
        """The loop's outputs: the last carry, then each ``ys`` stacked."""
        if self.cond is not None:
            return carry
        if not ys:
            avals = [v.aval for v in self.eqn.outvars[self.n_carry :]]
            return [*carry, *(jax.numpy.zeros(a.shape, a.dtype) for a in avals)]
        order = ys[::-1] if self.reverse else ys
        stacked = [jax.numpy.stack([step[j] for step in order]) for j in range(len(ys[0]))]
        return [*carry, *stacked]


def run_loop(
    loop: Loop, *, hook: Hook | None = None, where: str = "", stack: str = ""
) -> tuple[list[Any], list[Run]]:
    """Runs a loop op by op; returns its outputs and each iteration's ``Run``."""
    carry = list(loop.init)
    runs: list[Run] = []
    ys: list[list[Any]] = []
    i = 0
    while True:
        if loop.cond is not None:
            ok = interpret(loop.cond, [*loop.cond_consts, *carry]).outputs[0]
            if not bool(np.asarray(ok)):
                break
            xs: list[Any] = []
        else:
            assert loop.length is not None
            if i >= loop.length:
                break
            t = loop.length - 1 - i if loop.reverse else i
            xs = [x[t] for x in loop.xs]
        args = [*loop.consts, *carry, *xs]
        r = interpret(loop.body, args, hook=hook, where=f"{where}@{i}/", stack=stack)
        runs.append(r)
        carry = r.outputs[: loop.n_carry]
        ys.append(r.outputs[loop.n_carry :])
        i += 1
    if loop.cond is not None:
        loop.length = i
    return loop.finish(carry, ys), runs


def walk(closed: Any, hook: Hook, where: str = "") -> None:
    """Calls ``hook(eqn, [], [], where, "")`` on every equation, bodies included
    (every branch, a loop body once), without running anything."""
    for i, eqn in enumerate(closed.jaxpr.eqns):
        label = f"{where}{i}"
        hook(eqn, [], [], label, "")
        body = body_of(eqn)
        if body is not None:
            walk(body, hook, f"{label}/")
        elif eqn.primitive.name == "cond":
            for b, branch in enumerate(eqn.params["branches"]):
                walk(branch, hook, f"{label}/branch{b}/")
        elif eqn.primitive.name == "scan":
            walk(eqn.params["jaxpr"], hook, f"{label}@*/")
        elif eqn.primitive.name == "while":
            walk(eqn.params["body_jaxpr"], hook, f"{label}@*/")


# -- cutting --------------------------------------------------------------------


def defined(jaxpr: Any) -> list[Any]:
    """Every variable an equation defines, in order (drop variables left out)."""
    return [v for e in jaxpr.eqns for v in e.outvars if not isinstance(v, jex.DropVar)]


def live_at(jaxpr: Any, k: int) -> list[Any]:
    """The variables defined by ``eqns[:k]`` that ``eqns[k:]`` or the outputs read."""
    made = {v for e in jaxpr.eqns[:k] for v in e.outvars if not isinstance(v, jex.DropVar)}
    used: list[Any] = []
    seen: set[Any] = set()
    for e in jaxpr.eqns[k:]:
        for v in e.invars:
            if isinstance(v, jex.Var) and v in made and v not in seen:
                seen.add(v)
                used.append(v)
    for v in jaxpr.outvars:
        if isinstance(v, jex.Var) and v in made and v not in seen:
            seen.add(v)
            used.append(v)
    return used


def _effects(eqns: Sequence[Any]) -> Any:
    out: set[Any] = set()
    for e in eqns:
        out |= set(e.effects)
    return frozenset(out)


def _jaxpr(
    constvars: Sequence[Any],
    invars: Sequence[Any],
    outvars: Sequence[Any],
    eqns: Sequence[Any],
    effects: Any,
    *,
    arg_names: tuple[str, ...] | None = None,
) -> Any:
    """A new jaxpr, with the debug info JAX asks every jaxpr to carry."""
    info = jex.DebugInfo("treeguard.diagnose", "a cut of the program", arg_names, None)
    return jex.Jaxpr(list(constvars), list(invars), list(outvars), list(eqns), effects, info)


def _arg_names(j: Any) -> tuple[str, ...] | None:
    info = j.debug_info
    names = getattr(info, "arg_names", None)
    return tuple(names) if names is not None and len(names) == len(j.invars) else None


def prefix(closed: Any, k: int, outvars: Sequence[Any]) -> Any:
    """The program of the first ``k`` equations, returning ``outvars``."""
    j = closed.jaxpr
    eqns = list(j.eqns[:k])
    new = _jaxpr(j.constvars, j.invars, outvars, eqns, _effects(eqns), arg_names=_arg_names(j))
    return jex.ClosedJaxpr(new, closed.consts)


def alone(eqn: Any) -> Any:
    """One equation as a program of its own: its non-literal inputs in, its outputs out."""
    ins = unique_vars(eqn.invars)
    outs = [v for v in eqn.outvars if not isinstance(v, jex.DropVar)]
    return jex.ClosedJaxpr(_jaxpr([], ins, outs, [eqn], _effects([eqn])), [])


def unique_vars(atoms: Sequence[Any]) -> list[Any]:
    """The distinct variables among ``atoms`` (literals left out), in order."""
    out: list[Any] = []
    for v in atoms:
        if isinstance(v, jex.Var) and v not in out:
            out.append(v)
    return out


def with_every_intermediate(closed: Any) -> tuple[Any, list[Any]]:
    """The same program, also returning every value an equation defines."""
    j = closed.jaxpr
    extra = defined(j)
    new = _jaxpr(
        j.constvars, j.invars, [*j.outvars, *extra], j.eqns, j.effects, arg_names=_arg_names(j)
    )
    return jex.ClosedJaxpr(new, closed.consts), extra


def loop_with_intermediates(loop: Loop) -> tuple[Callable[..., Any], list[Any], list[Any]]:
    """A function running ``loop`` as a ``lax.scan`` of its known length that
    also returns, stacked per iteration in execution order, every value its
    body defines; with its arguments, and the body variables in output order."""
    body, extra = with_every_intermediate(loop.body)
    body_fn = jex.jaxpr_as_fun(body)
    n_consts, n_carry = len(loop.consts), loop.n_carry
    n_out = len(loop.body.jaxpr.outvars)
    assert loop.length is not None
    length = loop.length

    def run(consts: list[Any], init: list[Any], xs: list[Any]) -> Any:
        def step(carry: list[Any], x: list[Any]) -> Any:
            outs = body_fn(*consts, *carry, *(x or ()))
            return list(outs[:n_carry]), list(outs[n_carry:])

        _, ys = jax.lax.scan(step, init, xs if xs else None, length=length, reverse=loop.reverse)
        per = ys[n_out - n_carry :]
        # scan stacks in xs order; iterations ran in reverse for a reverse scan.
        return [y[::-1] for y in per] if loop.reverse else per

    del n_consts
    return run, [loop.consts, loop.init, loop.xs], extra


def inline_calls(closed: Any, args: Sequence[Any]) -> Any:
    """The same program with every call-like body (``jit``, custom
    derivatives) inlined, each equation keeping its source line; conds and
    loops are kept whole. Custom derivative rules are dropped: the result is
    for running forward, not for differentiating."""

    def run(*flat: Any) -> list[Any]:
        return _inlined(closed, list(flat))

    return jax.make_jaxpr(run)(*args)


def _inlined(closed: Any, args: list[Any]) -> list[Any]:
    j = closed.jaxpr
    env: dict[Any, Any] = dict(zip(j.constvars, closed.consts))
    env.update(zip(j.invars, args))
    for eqn in j.eqns:
        invals = [read(env, v) for v in eqn.invars]
        body = body_of(eqn)
        if body is not None:
            outs = _inlined(body, invals[len(invals) - len(body.jaxpr.invars) :])
        else:
            info = eqn.source_info
            with jsi.user_context(info.traceback, name_stack=info.name_stack):
                outs = bind(eqn, invals)
        for v, x in zip(eqn.outvars, outs):
            if not isinstance(v, jex.DropVar):
                env[v] = x
    return [read(env, v) for v in j.outvars]


def as_closed(fn: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """``fn`` traced on ``args``: its closed jaxpr and its output tree structure."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    return closed, jax.tree.structure(shapes)
