"""``replay_bundle``: a flight-recorder bundle replayed on a model, down to
the equation where the NaN or the infinity was born.

The bundle's files are checked first (each file's header digest against
the manifest, every tensor's hash), its params and optimizer state are
loaded into the structure the model's ``init`` and optimizer give (every
mismatch by path), and the batch is the recorded one or, for a bundle that
kept only its digest, the one given, checked against that digest. Then:

1. inputs that already hold NaN or Inf are named (nothing is born inside);
2. ``nan_origin`` runs the loss and its gradient op by op (with the step's
   recorded PRNG key, ``loss(params, batch, key)``, when the bundle holds one);
3. if both are finite, the optimizer's update is run op by op.

The first equation found, with its source line, is where the step went
non-finite.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any, Literal

import jax

from ..checkpoint import load
from ..errors import DiagnosisError
from ..nonfinite import find_nonfinite
from ..recorder.bundle import Bundle, read_bundle
from ..verify.model import Model
from .nan import NanSite, nan_origin

Stage = Literal["inputs", "loss", "optimizer", "none"]


@dataclasses.dataclass(frozen=True)
class Replay:
    """What the replay of a bundle found.

    Attributes:
      bundle: the bundle's directory.
      step: the step number it recorded.
      recorded: ``(tree, path)`` of the first non-finite leaf the recorder saw.
      stage: where the NaN was found: ``"inputs"`` (the params, the state or
        the batch already held it), ``"loss"`` (the loss or its gradient),
        ``"optimizer"`` (the update), or ``"none"`` (not reproduced).
      inputs: for ``"inputs"``, each input tree and its non-finite leaves.
      sites: every equation with finite inputs and a non-finite output, in
        execution order; the first is where the step went non-finite.
    """

    bundle: str
    step: int
    recorded: tuple[str, str] | None
    stage: Stage
    inputs: dict[str, dict[str, int]]
    sites: tuple[NanSite, ...]

    @property
    def exit_code(self) -> int:
        """1 when the NaN was located (in an equation or in the inputs), 3
        when the replay did not reproduce it."""
        return 3 if self.stage == "none" else 1

    def lines(self) -> list[str]:
        """The replay as terminal lines.

        Example:
          >>> r = Replay("b/000001-step7", 7, ("the grads", "['w']"), "none", {}, ())
          >>> print("\\n".join(r.lines()))
          bundle b/000001-step7: step 7, recorded first in the grads at ['w']
          the replay produced no NaN or Inf: the step is not reproduced from the bundle
        """
        head = f"bundle {self.bundle}: step {self.step}"
        if self.recorded is not None:
            tree, path = self.recorded
            head += f", recorded first in {tree}" + (f" at {path}" if path else "")
        out = [head]
        if self.stage == "inputs":
            for tree, found in self.inputs.items():
                for path, count in list(found.items())[:20]:
                    out.append(f"{tree} already held NaN or Inf: {path or '<root>'} ({count})")
        elif self.stage == "none":
            out.append(
                "the replay produced no NaN or Inf: the step is not reproduced from the bundle"
            )
        else:
            first = self.sites[0]
            out.append(f"first non-finite value: {first.describe()}")
            if len(self.sites) > 1:
                out.append(f"and {len(self.sites) - 1} more equation(s) after it:")
                out += [f"  {s.describe()}" for s in self.sites[1:20]]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The replay as JSON-ready data (``treeguard.replay/1``)."""
        return {
            "format": "treeguard.replay/1",
            "bundle": self.bundle,
            "step": self.step,
            "recorded": list(self.recorded) if self.recorded else None,
            "stage": self.stage,
            "inputs": self.inputs,
            "sites": [s.to_dict() for s in self.sites],
        }


def _optimizer_parts(model: Model, params_like: Any) -> tuple[Any, Any]:
    """``(state_like, apply)``: the optimizer state's structure, and
    ``apply(params, grads, state) -> (params, state)``, or ``(None, None)``."""
    if model.optimizer is not None:
        opt = model.optimizer

        def apply(params: Any, grads: Any, state: Any) -> Any:
            updates, new_state = opt.update(grads, state, params)
            return jax.tree.map(lambda p, u: p + u, params, updates), new_state

        return jax.eval_shape(opt.init, params_like), apply
    if model.opt_init is not None and model.update is not None:
        return jax.eval_shape(model.opt_init, params_like), model.update
    return None, None


def replay_bundle(
    bundle: str | os.PathLike[str] | Bundle,
    model: Model,
    /,
    *,
    batch: Any = None,
) -> Replay:
    """Replays a flight-recorder bundle on ``model`` and finds where the
    step's NaN or infinity was born.

    Args:
      bundle: the bundle's directory (or a ``Bundle`` from ``read_bundle``).
      model: the ``treeguard.verify.Model`` that was trained: its ``init``
        gives the params' structure, its ``loss`` and ``optimizer`` (or
        ``update``) are replayed. For a step recorded with a PRNG key
        (dropout), the loss is ``loss(params, batch, key)`` and is replayed
        with the recorded key.
      batch: the step's batch (a tree, or the path of a checkpoint of it
        written by ``treeguard.save``), for a bundle that kept only the
        batch's digest; it is checked against that digest. None for a bundle
        that recorded its batch.

    Returns:
      The ``Replay``: the stage and the equations found, first first.

    Raises:
      FormatError: for a directory that is not a bundle, or a damaged one.
      IntegrityError: if a file, a tensor or the given batch differs from
        what the bundle recorded.
      TreeMismatchError: if the bundle's params, state or batch do not fit
        the model, naming every path.
      DiagnosisError: for a digest-only bundle without ``batch``, a batch
        given for a bundle that recorded its own, or a loss that takes a key
        for a bundle without one (or the reverse).

    Example:
      >>> import tempfile, jax.numpy as jnp, optax
      >>> import treeguard as tg
      >>> from treeguard.verify import Model
      >>> def loss(p, b):
      ...     return jnp.sum(jnp.log(b["x"]) * p["w"])
      >>> model = Model(init=lambda k: {"w": jnp.ones(2)}, apply=lambda p, b: b["x"] * p["w"],
      ...               loss=loss, optimizer=optax.sgd(0.1), rtol=1e-6, atol=1e-6,
      ...               batch_spec=tg.spec_of({"x": tg.LeafSpec(("B",), "float32")}))
      >>> recorder = tg.FlightRecorder(tempfile.mkdtemp(), batch="record")
      >>> train = recorder.wrap(tg.optax_step(model.optimizer), loss=loss)
      >>> params = {"w": jnp.ones(2)}
      >>> try:
      ...     train(params, train.init(params), {"x": jnp.array([1.0, -2.0])})
      ... except tg.NonFiniteError as e:
      ...     replay = replay_bundle(e.bundle, model)
      >>> replay.stage, replay.sites[0].primitive
      ('loss', 'log')
    """
    found = bundle if isinstance(bundle, Bundle) else read_bundle(bundle)
    found.verify()
    params_like = jax.eval_shape(model.init, model.key())
    params = found.load_state("params", params_like)
    state_like, apply = _optimizer_parts(model, params_like)
    state = found.load_state("opt_state", state_like) if state_like is not None else None
    data = _batch(found, batch)
    recorded = found.first
    bad = {
        name: f
        for name, tree in (
            ("the params", params),
            ("the optimizer state", state),
            ("the batch", data),
        )
        if tree is not None and (f := find_nonfinite(tree))
    }
    if bad:
        return Replay(found.path, found.step, recorded, "inputs", bad, ())
    loss = _loss(found, model)
    sites = nan_origin(loss, params, data, grad=True)
    if sites:
        return Replay(found.path, found.step, recorded, "loss", {}, tuple(sites))
    if apply is not None:
        grads = jax.grad(loss)(params, data)
        sites = nan_origin(apply, params, grads, state)
        if sites:
            return Replay(found.path, found.step, recorded, "optimizer", {}, tuple(sites))
    return Replay(found.path, found.step, recorded, "none", {}, ())


def _takes(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` accepts ``n`` positional arguments (True when its
    signature cannot be read: the call then says)."""
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # pragma: no cover - builtins without a signature
        return True
    return True


def _loss(found: Bundle, model: Model) -> Callable[[Any, Any], Any]:
    """``loss(params, batch)`` as the step ran it: with the step's recorded
    PRNG key as the third argument (``loss(params, batch, key)``, as the
    recorder called it) when the bundle holds one.

    Raises:
      DiagnosisError: for a bundle with a key and a loss that takes none,
        or a loss that needs a key and a bundle without one.
    """
    fn: Callable[..., Any] = model.loss
    if not found.has_key:
        if not _takes(fn, 2) and _takes(fn, 3):
            raise DiagnosisError(
                "the model's loss takes a PRNG key, and the bundle recorded none",
                context=found.path,
                hint="record the step with its key: train(params, state, batch, key=key)",
            )
        return fn
    if not _takes(fn, 3):
        raise DiagnosisError(
            "the bundle recorded the step's PRNG key, and the model's loss takes none",
            context=found.path,
            hint="give the model the loss the step ran: loss(params, batch, key)",
        )
    key = found.load_state("key", None)
    return lambda params, batch: fn(params, batch, key)


def _batch(found: Bundle, batch: Any) -> Any:
    if found.batch_mode == "record":
        if batch is not None:
            raise DiagnosisError(
                "the bundle recorded its batch; no other batch is replayed",
                hint="leave out the batch (--batch)",
            )
        return found.load_batch()
    if batch is None:
        raise DiagnosisError(
            'the bundle kept only the batch\'s spec and digest (batch="digest")',
            hint=f"pass the batch of step {found.step}, saved with treeguard.save, as --batch "
            "FILE (replay_bundle(..., batch=...)); it is checked against the digest",
        )
    source = "the batch given"
    if isinstance(batch, (str, os.PathLike)):
        source = os.fspath(batch)
        batch = load(batch, like=found.batch_spec)
    found.check_batch(batch, source=source)
    return batch
