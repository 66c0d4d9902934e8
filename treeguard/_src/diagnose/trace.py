"""Recorded traces: the inputs and every intermediate value of a reference
run, in one checkpoint file, to compare on another machine.

``record_trace`` traces the function, runs it op by op and saves, with
``treeguard.save`` (so the file carries the environment fingerprint and a
hash per tensor): the flat inputs, the flat outputs, and the outputs of
every primitive equation, nested ones included (``"3/0@5/2"``), in
execution order. ``compare_trace`` loads it, runs the same function op by
op on the recorded inputs here, and compares equation by equation: the
first equation whose value differs is isolated on the *recorded* values of
its inputs: differing still, it is the ``culprit``; matching, its
difference came in through its inputs and it is a ``propagator``. The
environment difference (versions, backend, precision, ``XLA_FLAGS``) comes
with the result.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint
from ..env import environment_diff
from ..equation import site
from ..errors import DiagnosisError
from ..tolerance import TolerancePolicy
from ..verify.compare import LeafError, leaves_with_paths
from . import jaxpr as jx
from .divergence import PROPAGATORS_LISTED, Divergence, Judge, Role, Site, op_by_op

FORMAT = "treeguard.diagnose-trace/1"

#: Values beyond this many bytes in all are not recorded (the trace says so).
MAX_BYTES = 256 * 2**20

#: Environment variables that change XLA's arithmetic, recorded beside the fingerprint.
ENV_VARS = ("XLA_FLAGS", "JAX_DEFAULT_MATMUL_PRECISION", "JAX_ENABLE_X64", "JAX_PLATFORMS")


def _settings() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ENV_VARS}


@dataclasses.dataclass(frozen=True)
class Trace:
    """A recorded trace, read back.

    Attributes:
      path: the file.
      inputs: the flat inputs.
      outputs: the flat outputs.
      output_paths: each output leaf's key path.
      values: each recorded equation's label to its outputs (None where an
        output is no array).
      equations: each label to ``(primitive, source)``, in execution order.
      environment: the recording run's fingerprint.
      settings: the recording run's ``XLA_FLAGS`` and ``JAX_*`` settings.
      truncated: True when values beyond ``MAX_BYTES`` were left out.
      label: what was recorded (a name for the report).
    """

    path: Path
    inputs: list[Any]
    outputs: list[Any]
    output_paths: list[str]
    values: dict[str, list[Any]]
    equations: dict[str, tuple[str, str]]
    environment: dict[str, Any]
    settings: dict[str, Any]
    truncated: bool
    label: str

    def environment_diff(self) -> list[tuple[str, Any, Any]]:
        """``(key, recorded, here)`` for every differing fingerprint key and setting."""
        out = environment_diff(self.environment)
        here = _settings()
        out += [
            (k, self.settings.get(k), here[k]) for k in ENV_VARS if self.settings.get(k) != here[k]
        ]
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str], /) -> Trace:
        """Reads a recorded trace, every hash verified.

        Args:
          path: the file ``record_trace`` wrote.

        Returns:
          The ``Trace``, to pass to ``locate(fn, *args, candidate=trace)``.

        Raises:
          FormatError: if the file is not a checkpoint, or not a trace.
          IntegrityError: if its bytes do not match their hashes.
          DiagnosisError: if the trace's manifest is malformed.
        """
        return load_trace(path)


def _tape(
    closed: Any, flat: Sequence[Any], limit: int = MAX_BYTES
) -> tuple[list[Any], dict[str, list[Any]], dict[str, tuple[str, str]], bool, dict[str, Any]]:
    """Runs op by op, keeping every primitive equation's outputs by label."""
    values: dict[str, list[Any]] = {}
    eqns: dict[str, tuple[str, str]] = {}
    objects: dict[str, Any] = {}
    state = {"bytes": 0, "truncated": False}

    def hook(eqn: Any, invals: list[Any], outs: list[Any], where: str, stack: str) -> None:
        if jx.has_body(eqn):
            return
        eqns[where] = (eqn.primitive.name, site(eqn)[0])
        objects[where] = eqn
        kept: list[Any] = []
        for x in outs:
            if not (hasattr(x, "dtype") and jx.is_array(x)):
                kept.append(None)
                continue
            size = int(np.asarray(x).nbytes)
            if state["bytes"] + size > limit:
                state["truncated"] = True
                kept.append(None)
                continue
            state["bytes"] += size
            kept.append(x)
        values[where] = kept

    outs = jx.interpret(closed, flat, hook=hook).outputs
    return outs, values, eqns, bool(state["truncated"]), objects


def record_trace(
    path: str | os.PathLike[str],
    fn: Callable[..., Any],
    /,
    *args: Any,
    label: str = "",
) -> Path:
    """Records ``fn(*args)`` run op by op: its inputs, outputs and every intermediate.

    Args:
      path: the file to write (``trace.safetensors``).
      fn: the function.
      *args: its arguments (pytrees of arrays; PRNG keys are not recorded).
      label: what the trace is of, for reports.

    Returns:
      The path written.

    Raises:
      InvalidTreeError: for inputs that cannot be stored.
      OSError: if the file cannot be written.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> p = record_trace(os.path.join(tempfile.mkdtemp(), "t.safetensors"),
      ...                  lambda x: jnp.sin(x) * 2, jnp.ones(3))
      >>> Trace.load(p).equations
      {'0': ('sin', ...), '1': ('mul', ...)}
    """
    closed, _ = jx.as_closed(fn, *args)
    flat = jax.tree.leaves(args)
    closed = jx.inline_calls(closed, flat)
    outs, values, eqns, truncated, _ = _tape(closed, flat)
    ref_out = jax.tree.unflatten(jax.tree.structure(jax.eval_shape(fn, *args)), outs)
    out_paths = [p for p, _ in leaves_with_paths(ref_out)]
    stored_values = {
        k: {f"o{j}": x for j, x in enumerate(v) if x is not None} for k, v in values.items()
    }
    tree = {
        "inputs": {f"i{j}": x for j, x in enumerate(flat)},
        "outputs": {f"o{j}": x for j, x in enumerate(outs)},
        "values": {k: v for k, v in stored_values.items() if v},
    }
    meta = {
        "format": FORMAT,
        "label": label,
        "n_inputs": len(flat),
        "n_outputs": len(outs),
        "output_paths": out_paths,
        "equations": [[k, p, s] for k, (p, s) in eqns.items()],
        "outs_per_equation": {k: len(v) for k, v in values.items()},
        "settings": _settings(),
        "truncated": truncated,
    }
    checkpoint.save(path, tree, metadata=meta)
    return Path(path)


def load_trace(path: str | os.PathLike[str], /) -> Trace:
    """``Trace.load``, whose docstring says what it reads and refuses."""
    header = checkpoint.read_header(path)
    meta = header.metadata
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DiagnosisError(
            f"{path} is a checkpoint but not a recorded trace (format "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})",
            hint="record one with `treeguard diagnose MODULE:ATTR --record PATH`",
        )
    tree = checkpoint.load(path)
    try:
        n_in, n_out = int(meta["n_inputs"]), int(meta["n_outputs"])
        inputs = [jnp.asarray(tree["inputs"][f"i{j}"]) for j in range(n_in)]
        outputs = [np.asarray(tree["outputs"][f"o{j}"]) for j in range(n_out)]
        stored = tree.get("values", {})
        values: dict[str, list[Any]] = {}
        for k, n in meta["outs_per_equation"].items():
            got = stored.get(k, {})
            values[k] = [got.get(f"o{j}") for j in range(int(n))]
        equations = {str(k): (str(p), str(s)) for k, p, s in meta["equations"]}
        paths = [str(p) for p in meta["output_paths"]]
    except (KeyError, TypeError, ValueError) as e:
        raise DiagnosisError(
            f"{path}: the trace's manifest is malformed ({type(e).__name__}: {e})",
            hint="record it again",
        ) from e
    return Trace(
        Path(path),
        inputs,
        outputs,
        paths,
        values,
        equations,
        dict(header.env),
        dict(meta.get("settings") or {}),
        bool(meta.get("truncated")),
        str(meta.get("label", "")),
    )


def compare_trace(
    fn: Callable[..., Any],
    trace: Trace,
    /,
    *like: Any,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: TolerancePolicy | None = None,
) -> Divergence:
    """Runs ``fn`` here on a trace's inputs, op by op, and compares it with the
    trace equation by equation.

    Args:
      fn: the same function the trace was recorded from, traced here on
        the recorded inputs.
      trace: the ``Trace`` (``Trace.load(path)``).
      *like: arguments of the recorded structure (their values are not
        used): the recorded flat inputs are put back into this tree. None
        passes the flat inputs as positional arguments.
      rtol: the default relative tolerance of float leaves.
      atol: the default absolute tolerance.
      tolerances: per-dtype and per-path rules.

    Returns:
      A ``Divergence`` with reference ``recorded trace`` and candidate
      ``eager here``; its notes list the environment difference.

    Raises:
      DiagnosisError: if the function takes other inputs than the trace holds.
    """
    run = fn
    if like:
        treedef = jax.tree.structure(like)
        if len(jax.tree.leaves(like)) != len(trace.inputs):
            raise DiagnosisError(
                f"the arguments have {len(jax.tree.leaves(like))} leaves, the trace "
                f"{len(trace.inputs)} inputs",
                hint="pass arguments shaped as when recording",
            )

        def flat_fn(*flat: Any) -> Any:
            return fn(*jax.tree.unflatten(treedef, list(flat)))

        run = flat_fn
    tols = TolerancePolicy.of(rtol=rtol, atol=atol, base=tolerances)
    return _compare_flat(run, trace, tols)


def _compare_flat(fn_flat: Callable[..., Any], trace: Trace, tols: TolerancePolicy) -> Divergence:
    """``compare_trace`` for a function of the trace's flat inputs."""
    started = time.perf_counter()
    judge = Judge(tols, op_by_op)
    closed = jx.inline_calls(_traced_here(fn_flat, trace), trace.inputs)
    outs, values, eqns, _, objects = _tape(closed, trace.inputs, limit=2**62)
    env_diff = trace.environment_diff()
    notes = [
        f"environment: {k} was {was!r} when recorded, is {now!r} here" for k, was, now in env_diff
    ]
    if trace.truncated:
        notes.append("the trace was truncated: later equations were not recorded")
    same = [k for k in eqns if trace.equations.get(k, ("",))[0] == eqns[k][0]]
    notes += _program_difference(trace, eqns, same)
    leaves = tuple(judge.error(a, e, p) for p, a, e in zip(trace.output_paths, outs, trace.outputs))
    common: dict[str, Any] = {
        "reference": f"recorded trace {trace.path.name}",
        "candidate": "eager here",
        "leaves": leaves,
        "n_equations": len(eqns),
        "tolerances": tols.to_dict(),
        "environment": tuple(env_diff),
    }
    diverging = [k for k in same if _differs(judge, trace.values.get(k, []), values[k])]
    if not diverging:
        outcome = "none" if all(e.ok for e in leaves) else "vanishes"
        return Divergence(
            outcome=outcome,  # type: ignore[arg-type]
            classification=None if outcome == "none" else "unrecorded",
            seconds=time.perf_counter() - started,
            notes=tuple(notes),
            **common,
        )
    sites = [
        _isolate(judge, objects[k], label=k, trace=trace, here=values, closed=closed)
        for k in diverging[: PROPAGATORS_LISTED + 1]
    ]
    if len(diverging) > len(sites):
        notes.append(f"{len(diverging)} equations differ; the first {len(sites)} are listed")
    return Divergence(
        outcome="located",
        classification="environment" if env_diff else "same environment",
        equation=sites[0],
        propagators=tuple(sites[1:]),
        reaches=tuple(e.path or "<root>" for e in leaves if not e.ok),
        compiles=judge.compiles,
        seconds=time.perf_counter() - started,
        notes=tuple(notes),
        **common,
    )


def _differs(judge: Judge, recorded: list[Any], here: list[Any]) -> bool:
    """Whether an equation's outputs here differ from the recorded ones
    (a value not recorded is not compared)."""
    return any(
        r is not None and g is not None and judge.differs(g, r) for r, g in zip(recorded, here)
    )


def _traced_here(fn_flat: Callable[..., Any], trace: Trace) -> Any:
    """``fn_flat`` traced here on the trace's inputs, as a closed jaxpr.

    Raises:
      DiagnosisError: when the function refuses the recorded inputs (a model
        that validates its input raises its own error): the finding, typed.
    """
    try:
        closed, _ = jx.as_closed(fn_flat, *trace.inputs)
    except Exception as e:
        shapes = ", ".join(
            f"{np.dtype(x.dtype).name}{list(np.shape(x))}" for x in trace.inputs[:8]
        ) + (", ..." if len(trace.inputs) > 8 else "")
        why = str(e).splitlines()[0][:300] if str(e) else ""
        raise DiagnosisError(
            f"the function does not take the trace's {len(trace.inputs)} inputs ({shapes}): "
            f"{type(e).__name__}: {why}",
            hint=f"compare with the function {trace.label or 'that was recorded'}, on inputs "
            "of the shapes it was recorded with",
        ) from e
    return closed


def _program_difference(trace: Trace, eqns: dict[str, Any], same: list[str]) -> list[str]:
    """A note where the program here differs from the recorded one (only the
    equations with matching labels are then compared)."""
    rec_labels, here_labels = list(trace.equations), list(eqns)
    if rec_labels == here_labels and len(same) == len(here_labels):
        return []
    first = next(
        (
            (a, b)
            for a, b in zip(rec_labels + [""] * len(here_labels), here_labels)
            if a != b or trace.equations.get(a, ("",))[0] != eqns[b][0]
        ),
        None,
    )
    return [
        f"the program differs from the recorded one ({len(rec_labels)} equations recorded, "
        f"{len(here_labels)} here; first difference at {first}); matching labels compared"
    ]


def _isolate(
    judge: Judge,
    eqn: Any,
    *,
    label: str,
    trace: Trace,
    here: dict[str, list[Any]],
    closed: Any,
) -> Site:
    """The equation alone, here, on the recorded values of its inputs."""
    rec_in = _recorded_inputs(eqn, label, trace, closed)
    rec_out = trace.values.get(label, [])
    errs: tuple[LeafError, ...]
    role: Role
    if rec_in is None:
        errs = judge.errors(
            [g for g, r in zip(here[label], rec_out) if r is not None and g is not None],
            [r for g, r in zip(here[label], rec_out) if r is not None and g is not None],
        )
        role = "culprit" if _first_level(label) else "propagator"
    else:
        outs = judge.run(jx.alone(eqn), rec_in)
        iso = judge.errors(
            [o for o, r in zip(outs, rec_out) if r is not None],
            [r for r in rec_out if r is not None],
        )
        role = "culprit" if any(not e.ok for e in iso) else "propagator"
        errs = judge.errors(
            [g for g, r in zip(here[label], rec_out) if r is not None and g is not None],
            [r for g, r in zip(here[label], rec_out) if r is not None and g is not None],
        )
    source, stack = site(eqn)
    it = _iteration(label)
    return Site(label, eqn.primitive.name, source, stack, role, it, errs, jx.eqn_text(eqn))


def _first_level(label: str) -> bool:
    return "/" not in label and "@" not in label


def _iteration(label: str) -> int | None:
    if "@" not in label:
        return None
    tail = label.rsplit("@", 1)[1]
    return int(tail.split("/", 1)[0])


def _recorded_inputs(eqn: Any, label: str, trace: Trace, closed: Any) -> list[Any] | None:
    """The recorded values of a top-level equation's inputs, or None when it is
    nested (its inputs are not all named at the top level)."""
    if not _first_level(label):
        return None
    j = closed.jaxpr
    made: dict[Any, tuple[str, int]] = {}
    for i, e in enumerate(j.eqns):
        for o, v in enumerate(e.outvars):
            made[v] = (str(i), o)
    ins = jx.unique_vars(eqn.invars)
    out: list[Any] = []
    for v in ins:
        if v in j.invars:
            out.append(trace.inputs[j.invars.index(v)])
        elif v in j.constvars:
            out.append(closed.consts[j.constvars.index(v)])
        elif v in made:
            k, o = made[v]
            rec = trace.values.get(k)
            if rec is None or o >= len(rec) or rec[o] is None:
                return None
            out.append(jnp.asarray(rec[o]))
        else:
            return None
    return out
