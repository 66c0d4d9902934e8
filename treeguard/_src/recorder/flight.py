"""``FlightRecorder``: a training step that, on the first NaN or Inf, leaves
behind everything needed to replay it.

The check is traced into the step when the step is jitted: it reads each
leaf of the loss, the grads, the new params and the new state once (on the
CPU a large f32 or complex leaf through a product with zeros, which XLA runs
as a matrix-vector product; on one accelerator a fused sum over the leaves
of each shape; past ``PER_LEAF`` leaves, one reduction per dtype over the
joined leaves). With ``check="now"`` one scalar is read per step, before the
call returns; the params and the state from before the step are the call's
own arguments. With ``check="next"`` each program hands the next one a mark
that sticks at the first non-finite step (the step's own loss, NaN from then
on, where it can carry it; a two-int32 watch otherwise), and from then on
returns the params and the state it was given (``sticky``); the host reads
the mark every ``READ_EVERY`` steps without stalling the device's queue
(``pending``), and the step that went wrong is replayed from the held params
and its kept batch, on the error path only. Which leaves hold what is worked
out on the host, on the error path only; nothing is copied while the steps
are finite.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax

from ..errors import ConfigError, NonFiniteError, RecorderError
from ..nonfinite import host_nonfinite
from ..optimizer import OptaxStep
from ..updates.compiled import nonfinite_sections
from ..updates.layout import labelled_trees
from .bundle import BATCH_MODES, BatchMode, Found, write_bundle
from .finite import carried, carries, finite_flag
from .pending import Pending, Refused, Unread
from .sticky import first_mark, hold, moved

_BATCH_HINT = (
    'pass batch="record" to keep the raw batch in the bundle (it can then be replayed as '
    'is), or batch="digest" to keep only its spec and digest (the batch stays out of the '
    "files; replaying then needs the batch itself, checked against the digest); a batch "
    "may hold personal data, so this is a choice written in the code"
)

#: The trees ``check="next"`` holds from before a non-finite step, as its errors name them.
_HELD = ("the params", "the optimizer state")

#: When a step's finiteness flag is read: ``"now"``, before the call returns;
#: ``"next"``, later, every ``READ_EVERY`` steps (or at ``flush``), from the device.
CheckWhen = Literal["now", "next"]
CHECK_WHEN: tuple[CheckWhen, ...] = ("now", "next")


_check = jax.jit(finite_flag)


class _Dispatched(NamedTuple):
    """A dispatched step: its number, outputs, flag and arguments (a tuple:
    made on every step, where a frozen dataclass's ``__init__`` costs several
    times as much)."""

    number: int
    out: Any
    ok: Any
    params: Any
    opt_state: Any
    batch: Any
    key: Any


def _loss_of(out: Any) -> Any:
    """A step function's loss among its outputs: the third item of a plain
    tuple (a named tuple's fields are its own, and keep their places)."""
    return out[2] if type(out) is tuple and len(out) > 2 else None


def _is_jitted(fn: Any) -> bool:
    return callable(fn) and hasattr(fn, "lower") and hasattr(fn, "trace")


class FlightRecorder:
    """Writes a replayable bundle of the first training step that produces
    NaN or Inf, then raises.

    ``step = recorder.wrap(step)`` returns the step to call instead. On a
    step whose loss, grads, new params or new optimizer state hold NaN or
    Inf, it writes a bundle (see ``read_bundle``) into ``directory`` and
    raises ``NonFiniteError`` naming the first non-finite leaf and the
    bundle's path. ``treeguard diagnose --bundle DIR MODULE:ATTR`` replays it.

    Args:
      directory: where bundles go (created when the first one is written).
        It must be a real directory: a link there is refused when a bundle
        is written, and reported with the step's error.
      batch: ``"record"`` keeps the raw batch in the bundle; ``"digest"``
        keeps only its spec and the digest of each leaf. Required: a batch
        may hold personal data, so the choice is written in the code.
      keep: how many bundles the directory keeps; the oldest (by the
        recorder's own sequence number) are removed beyond it.

    Raises:
      ConfigError: for a missing or unknown ``batch``, or a ``keep`` below 1.

    Example:
      >>> import jax.numpy as jnp, optax, tempfile
      >>> import treeguard as tg
      >>> recorder = tg.FlightRecorder(tempfile.mkdtemp(), batch="digest", keep=2)
      >>> train = recorder.wrap(tg.optax_step(optax.sgd(0.1)),
      ...                       loss=lambda p, b: jnp.sum(jnp.log(b["x"]) * p["w"]))
      >>> params = {"w": jnp.ones(2)}
      >>> state = train.init(params)
      >>> params, state, loss = train(params, state, {"x": jnp.array([1.0, 2.0])})
      >>> params, state, loss = train(params, state, {"x": jnp.array([1.0, -2.0])})
      Traceback (most recent call last):
      ...
      treeguard.NonFiniteError: step 1: 1 leaf holds NaN or Inf in the loss:
        <root>: 1 of 1 value (f32[])
      ...
      flight recorder bundle: .../000001-step1
      hint: ...
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        /,
        *,
        batch: BatchMode | None = None,
        keep: int = 3,
    ) -> None:
        if batch is None:
            raise ConfigError("FlightRecorder needs batch=", hint=_BATCH_HINT)
        if batch not in BATCH_MODES:
            shown = repr(batch[:40]) if isinstance(batch, str) else type(batch).__name__
            raise ConfigError(
                f"FlightRecorder's batch must be 'record' or 'digest', got {shown}",
                hint=_BATCH_HINT,
            )
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ConfigError(
                f"FlightRecorder's keep must be an int of at least 1, got {keep!r}",
                hint="keep=3 keeps the three newest bundles",
            )
        self.directory = os.path.abspath(os.fspath(directory))
        self.batch: BatchMode = batch
        self.keep = keep

    def __repr__(self) -> str:
        return f"FlightRecorder({self.directory!r}, batch={self.batch!r}, keep={self.keep})"

    def wrap(
        self,
        step: Any,
        /,
        *,
        loss: Callable[..., Any] | None = None,
        start: int = 0,
        check: CheckWhen = "now",
    ) -> RecordedStep:
        """The step to call instead of ``step``, recorded.

        Two kinds of step:

        * an ``OptaxStep`` (``treeguard.optax_step(...)``) with ``loss``:
          the recorded step is ``train(params, opt_state, batch, key=None)
          -> (params, opt_state, loss)``; it computes ``loss(params, batch)``
          (``loss(params, batch, key)`` with a key) and its grads, and
          applies the optimizer with the ``OptaxStep``'s checks, all in one
          compiled program that also checks the loss, the grads, the new
          params and the new state;
        * a function ``step(params, opt_state, batch)`` (or with a fourth
          argument, the PRNG key) returning a tuple whose first two items
          are the new params and the new optimizer state (the rest, such as
          the loss, is checked too). A jitted function gets the check
          compiled into it; the recorder calls it inside its own ``jax.jit``,
          so the params from before the step stay alive (donation is off).

        Args:
          step: the ``OptaxStep`` or the step function.
          loss: ``loss(params, batch) -> scalar``, with an ``OptaxStep`` only.
          start: the number of the first step (a resumed run's step).
          check: when a step's finiteness flag is read. ``"now"`` (the
            default): before the call returns, so a non-finite step raises
            from its own call and its outputs never reach the caller; the
            host waits for every step. ``"next"`` (a jitted step or an
            ``OptaxStep``; the accelerator's pace): the flag stays on the
            device, sticking at the first non-finite step, from which on
            every step returns the params and the state it was given
            unchanged, and a floating scalar loss comes back NaN (it carries
            the flag from step to step: the program makes no output more
            than the step's own; a loss of another kind comes back as the
            step computed it from the held params); the host reads the flag
            every 16 steps, in the background, so the device's queue never
            drains. A non-finite step then raises from a call up to 17 steps
            after it, or from ``flush()``: the bundle and the error's
            ``params`` are of the step that went wrong (replayed from the
            held params and its batch), and the params the caller holds are
            those from before it. Call ``flush()`` after the last step, and
            pass each call the params and state the call before returned
            (the recorder replays from the newest it was given). It keeps
            the batches, keys and losses of the steps not read yet alive (up
            to 17), and no params: a batch must not be changed in place, nor
            a returned loss deleted or donated, until its flag is read.

        Returns:
          The ``RecordedStep``.

        Raises:
          ConfigError: for an ``OptaxStep`` without ``loss`` (or ``loss``
            with a function), an ``OptaxStep`` whose ``on_nonfinite`` is not
            ``"raise"``, a step that is not callable, an unknown ``check``,
            or ``check="next"`` with a step function that is not jitted.
        """
        return RecordedStep(self, step, loss=loss, start=start, check=check)


class RecordedStep:
    """A training step wrapped by ``FlightRecorder.wrap``.

    Attributes:
      recorder: the ``FlightRecorder``.
      step_number: the number the next call gets (read-only: the recorder
        numbers the steps it has not read yet by it).
    """

    def __init__(
        self,
        recorder: FlightRecorder,
        step: Any,
        *,
        loss: Callable[..., Any] | None,
        start: int,
        check: CheckWhen = "now",
    ) -> None:
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ConfigError(f"start must be a step number (an int >= 0), got {start!r}")
        if check not in CHECK_WHEN:
            shown = repr(check[:40]) if isinstance(check, str) else type(check).__name__
            raise ConfigError(
                f"check must be 'now' or 'next', got {shown}",
                hint='check="now" reads each step\'s flag before it returns; check="next" '
                "reads it once the next step is dispatched",
            )
        self.recorder = recorder
        self._number = start
        self.check: CheckWhen = check
        # check="next": the steps not read yet; whether the loss carries the
        # mark (decided at the first call, from the step's output shapes)
        self._pending = Pending()
        self._carrier: Any = None
        self._optax: OptaxStep | None = None
        if isinstance(step, OptaxStep):
            if not callable(loss):
                raise ConfigError(
                    "an OptaxStep is recorded with the loss it is trained on",
                    hint="recorder.wrap(step, loss=model_loss), loss(params, batch) -> scalar",
                )
            if step.on_nonfinite != "raise":
                raise ConfigError(
                    f"the OptaxStep has on_nonfinite={step.on_nonfinite!r}; the recorder raises "
                    "on the first non-finite step",
                    hint='record an optax_step with on_nonfinite="raise" (the default)',
                )
            # the same optimizer and checks, traced inside the recorder's program,
            # which does the one finiteness check itself
            self._optax = OptaxStep(
                step.optimizer, dtype_policy=step.dtype_policy, on_nonfinite="ignore"
            )
            self._loss = loss
            self._fn: Callable[..., Any] = jax.jit(
                self._traced_optax if check == "now" else self._traced_optax_next
            )
        elif callable(step):
            if loss is not None:
                raise ConfigError(
                    "loss= goes with an OptaxStep; a step function computes its own loss",
                    hint="recorder.wrap(step) for a function step(params, opt_state, batch)",
                )
            self._user = step
            if check == "next" and not _is_jitted(step):
                raise ConfigError(
                    'check="next" compiles the flag into the step\'s program, and the step '
                    "is not jitted",
                    hint='record jax.jit(step), or use check="now"',
                )
            self._fn = jax.jit(self._traced_plain) if _is_jitted(step) else self._eager_plain
            if check == "next":
                self._fn = jax.jit(self._traced_plain_next)
        else:
            raise ConfigError(
                f"the step to record is a {type(step).__name__}, not a function or an OptaxStep",
                hint="recorder.wrap(train_step) or recorder.wrap(tg.optax_step(opt), loss=loss)",
            )
        # the error path's program: the step alone, compiled when a step is first refused
        self._replay: Callable[..., Any] = jax.jit(
            self._optax_trees if self._optax is not None else self._call_user
        )

    @property
    def step_number(self) -> int:
        """The number the next call gets."""
        return self._number

    def __repr__(self) -> str:
        return f"RecordedStep({self.recorder!r}, step_number={self._number})"

    def init(self, params: Any, /) -> Any:
        """The optimizer's first state (``OptaxStep.init``), for an ``OptaxStep``.

        Raises:
          ConfigError: for a recorded step function, which has no optimizer.
        """
        if self._optax is None:
            raise ConfigError("a recorded step function has no optimizer to init")
        return self._optax.init(params)

    # -- the traced programs ------------------------------------------------------------

    def _optax_trees(self, params: Any, opt_state: Any, batch: Any, key: Any) -> Any:
        """The loss, the grads, the new params and the new state (traced)."""
        assert self._optax is not None
        args = (batch,) if key is None else (batch, key)
        value, grads = jax.value_and_grad(self._loss)(params, *args)
        new_params, new_state = self._optax(params, grads, opt_state)
        return (value, grads, new_params, new_state)

    def _traced_optax(self, params: Any, opt_state: Any, batch: Any, key: Any) -> Any:
        value, _, new_params, new_state = trees = self._optax_trees(params, opt_state, batch, key)
        ok, carry = self._flag(value, finite_flag(jax.tree.leaves(trees)))
        # the grads stay in the program, and the loss where the carry stands for
        # it: a refused step's replay remakes them
        return (value if carry is None else None, None, new_params, new_state), ok, carry

    def _traced_optax_next(
        self, params: Any, opt_state: Any, batch: Any, key: Any, mark: jax.Array
    ) -> Any:
        value, grads, new_params, new_state = self._optax_trees(params, opt_state, batch, key)
        ok = finite_flag(jax.tree.leaves((value, grads, new_params, new_state)))
        bad, mark = moved(mark, ok, value)
        new_params, new_state = hold(bad, (params, opt_state), (new_params, new_state), what=_HELD)
        # the grads stay in the program: a replay remakes them for an error; a
        # carried loss stands for the loss
        return (None if mark.ndim == 0 else value, None, new_params, new_state), mark

    def _traced_plain(self, params: Any, opt_state: Any, batch: Any, key: Any) -> Any:
        out = self._call_user(params, opt_state, batch, key)
        value = _loss_of(out)
        ok, carry = self._flag(value, finite_flag(jax.tree.leaves(out)))
        if carry is not None:  # the carry stands for the loss: one output less
            out = (*out[:2], None, *out[3:])
        return out, ok, carry

    def _traced_plain_next(
        self, params: Any, opt_state: Any, batch: Any, key: Any, mark: jax.Array
    ) -> Any:
        out = self._call_user(params, opt_state, batch, key)
        loss = _loss_of(out) if mark.ndim == 0 else None
        bad, mark = moved(mark, finite_flag(jax.tree.leaves(out)), loss)
        held = hold(bad, (params, opt_state), out[:2], what=_HELD)
        if mark.ndim == 0:  # a carried loss stands for the loss: no output more than the step's
            return (*held, None, *out[3:]), mark
        rest = (*held, *out[2:])
        return (type(out)._make(rest) if hasattr(out, "_make") else rest), mark

    def _flag(self, loss: Any, ok: jax.Array) -> tuple[Any, Any]:
        """The program's flag outputs, ``(ok, carried loss)``, one of them None: the
        loss carrying the flag where it can, the flag itself otherwise. Each
        output the program does not need is a buffer less made on every step
        (about 10 us of a TPU v5e host's time), so where the carried loss is
        returned the program leaves the loss itself out; the error path
        replays the step for it."""
        carry = carried(loss, ok) if loss is not None else None
        return (ok, None) if carry is None else (None, carry)

    def _eager_plain(self, params: Any, opt_state: Any, batch: Any, key: Any) -> Any:
        out = self._call_user(params, opt_state, batch, key)
        on_device: list[Any] = []
        on_host: list[Any] = []
        for x in jax.tree.leaves(out):
            (on_device if isinstance(x, jax.Array) else on_host).append(x)
        # a numpy or Python value is checked at its own dtype: through ``_check``
        # an f64 beyond f32's range would become Inf without x64, though the
        # caller gets it back finite
        if any(host_nonfinite(x) for x in on_host):
            return out, False, None
        return out, _check(on_device), None

    def _call_user(self, params: Any, opt_state: Any, batch: Any, key: Any) -> Any:
        out = (
            self._user(params, opt_state, batch)
            if key is None
            else self._user(params, opt_state, batch, key)
        )
        if not isinstance(out, tuple) or len(out) < 2:
            raise ConfigError(
                f"the recorded step returned {type(out).__name__}, not a tuple "
                "(new_params, new_opt_state, ...)",
                hint="return (params, opt_state, loss) from the step",
            )
        return out

    # -- a call -------------------------------------------------------------------------

    def __call__(self, params: Any, opt_state: Any, batch: Any, /, key: Any = None) -> Any:
        """One step; see ``FlightRecorder.wrap``.

        Raises:
          NonFiniteError: if the loss, the grads, the new params or the new
            state hold NaN or Inf, after the bundle is written (its path in
            ``.bundle``; a bundle that could not be written is in
            ``.bundle_error`` and chained).
          ConfigError: with ``check="next"``, for a step that returns params
            or state of other shapes or dtypes than it was given, a loss
            that stops being the scalar of the run's first step, or a
            returned loss that was deleted or donated.
        """
        if self.check == "next":
            return self._call_next(params, opt_state, batch, key)
        out, ok, carry = self._fn(params, opt_state, batch, key)
        if carry is not None:
            # the one host sync: the loss, NaN unless every checked leaf is
            # finite; the caller's read of the loss then finds it on the host
            finite = math.isfinite(float(carry))
        else:
            if isinstance(ok, jax.Array):
                # the loss comes to the host with the flag, in one wait
                for x in self._scalars(out):
                    x.copy_to_host_async()
            finite = bool(ok)  # the one host sync: a scalar
        if finite:
            self._number += 1
            return self._returned(out, carry)
        # made on the error path only: a finite step with check="now" keeps nothing
        if carry is not None or self._optax is not None:
            out = self._completed(out, carry, (params, opt_state, batch, key))
        raise self._refuse(_Dispatched(self._number, out, ok, params, opt_state, batch, key))

    def _completed(self, out: Any, carry: Any, args: tuple[Any, Any, Any, Any]) -> Any:
        """A refused step's outputs with what its program left out, replayed: the
        loss the carry stood for (NaN once any leaf was not finite) and an
        ``OptaxStep``'s grads. Where everything is then finite, the replay did
        not compute what the step did; the loss, the one output the carry
        stands for, is then reported as the carry (non-finite)."""
        replayed = self._replay(*args)
        if self._optax is not None:
            at, full = 0, (out[0] if carry is None else replayed[0], replayed[1], *out[2:])
        else:
            at, full = 2, (*out[:2], replayed[2], *out[3:]) if carry is not None else out
        if carry is not None and bool(_check(jax.tree.leaves(full))):
            full = (*full[:at], carry, *full[at + 1 :])
        return full

    def _call_next(self, params: Any, opt_state: Any, batch: Any, key: Any) -> Any:
        """A step with ``check="next"``: dispatched with the mark the step before
        it returned; the mark of an earlier step read once this one is
        dispatched, when its copy began."""
        pending = self._pending
        mark = pending.next_mark()
        if mark is None:
            mark = self._first_mark(params, opt_state, batch, key)
            pending.start(mark, self._number)
        out, mark = self._fn(params, opt_state, batch, key, mark)
        held = (out[2], out[3]) if self._optax is not None else (out[0], out[1])
        refused = pending.dispatched(Unread(self._number, batch, key, mark), held)
        self._number += 1
        if refused is not None:
            self._refuse_held(refused)
        return self._returned(out, mark if mark.ndim == 0 else None)

    def _first_mark(self, params: Any, opt_state: Any, batch: Any, key: Any) -> jax.Array:
        """The mark of a run's first step: a carried loss where the step returns
        a floating scalar loss, strongly typed, that can hold NaN (found from
        its output shapes, once); the watch otherwise."""
        if self._carrier is None:
            shapes = jax.eval_shape(self._replay, params, opt_state, batch, key)
            loss = shapes[0] if self._optax is not None else _loss_of(shapes)
            weak = getattr(loss, "weak_type", False)
            self._carrier = getattr(loss, "dtype", False) if carries(loss) and not weak else False
        return first_mark((params, opt_state), None if self._carrier is False else self._carrier)

    def flush(self) -> None:
        """Reads the flag of the last dispatched step (``check="next"``);
        nothing to do with ``check="now"``.

        Raises:
          NonFiniteError: if that step, or one not read yet before it, held
            NaN or Inf, as ``__call__`` does.
        """
        refused = self._pending.flush()
        if refused is not None:
            self._refuse_held(refused)

    def _refuse_held(self, refused: Refused) -> None:
        """Raises for the first non-finite step of ``check="next"``, replayed from
        the params and state held from before it."""
        step, params, opt_state = refused
        self._number = step.number
        out = self._replay(params, opt_state, step.batch, step.key)
        raise self._refuse(
            _Dispatched(step.number, out, False, params, opt_state, step.batch, step.key)
        )

    def _scalars(self, out: Any) -> list[jax.Array]:
        """The step's scalar outputs beside the params and the state (the loss)."""
        extra = out[0] if self._optax is not None else out[2:]
        return [x for x in jax.tree.leaves(extra) if isinstance(x, jax.Array) and x.size == 1]

    def _returned(self, out: Any, carry: Any) -> Any:
        """What the caller gets: the step's outputs, its loss replaced by the
        carried loss (the same value, already on the host) where there is one."""
        if self._optax is not None:
            value, _, new_params, new_state = out
            return new_params, new_state, value if carry is None else carry
        return out if carry is None else (*out[:2], carry, *out[3:])

    def _labelled(self, out: Any) -> list[tuple[str, Any]]:
        if self._optax is not None:
            value, grads, new_params, new_state = out
            return [
                ("the loss", value),
                ("the grads", grads),
                ("the updated params", new_params),
                ("the updated state", new_state),
            ]
        named = [("the updated params", out[0]), ("the updated state", out[1])]
        for i, extra in enumerate(out[2:], start=3):
            named.append(("the loss" if i == 3 else f"the step's output {i}", extra))
        # the loss is looked at first: it comes before the params in the step
        return named[2:3] + named[:2] + named[3:]

    def _refuse(self, step: _Dispatched) -> NonFiniteError:
        number, out, params, opt_state = step.number, step.out, step.params, step.opt_state
        checked = labelled_trees(self._labelled(out))
        sections, found_all = nonfinite_sections(checked)
        found = [Found(lay.label, f) for lay, f in zip(checked, found_all) if f]
        if not found and self.check == "next":
            sections = [
                "its flag was set on the device, but replaying it from the params held "
                "before it and its kept batch gave finite values: the batch was changed in "
                "place after the call, or the replay computed differently"
            ]
        rec = self.recorder
        bundle: str | None = None
        failure: RecorderError | None = None
        try:
            bundle = write_bundle(
                rec.directory,
                step=number,
                params=params,
                opt_state=opt_state,
                key=step.key,
                batch=step.batch,
                mode=rec.batch,
                found=found,
                keep=rec.keep,
            )
        except RecorderError as e:
            failure = e
        by_label = {lay.label: f for lay, f in zip(checked, found_all)}
        first = found[0] if found else None
        before = (
            "the step was not applied (your params hold the values from before it)"
            if self.check == "now"
            else "its flag was read later (check='next'): from it on, the steps returned the "
            "params and the state from before it unchanged (this error's .params and .state)"
        )
        hint = (
            f"{before}; replay it with `treeguard diagnose --bundle {bundle} MODULE:ATTR`"
            if bundle is not None
            else f"{before}; fix the recorder's directory to keep a bundle next time"
        )
        error = NonFiniteError(
            f"step {number}: " + "\n".join(sections),
            counts=by_label.get("the updated params", {}),
            state_counts=by_label.get("the updated state", {}),
            params=params,
            state=opt_state,
            path=next(iter(first.leaves)) if first else None,
            where=first.tree if first else None,
            bundle=bundle,
            bundle_error=failure,
            hint=hint,
        )
        error.__cause__ = failure
        return error
