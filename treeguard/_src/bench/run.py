"""``run(fn, *args) -> BenchResult``: a compile-aware measurement.

The protocol:

1. The phases are timed apart through JAX's ahead-of-time API: ``trace``,
   ``lower``, ``compile``, then the first call.
2. Warm-up calls, then one calibration: each sample repeats the call
   ``loops`` times so that it lasts at least ``min_time``.
3. ``samples`` timed samples. Every call ends with ``jax.block_until_ready``
   over its whole output tree, inside the clock.
4. A ``jax.monitoring`` listener counts traces, lowerings and compiles.
   Any of them inside the timed window makes the result invalid, and its
   ``status`` says how many there were.

The result carries the distribution of the samples (never a best-of), the
compiled program's memory and cost analysis where the backend gives them,
and the machine's conditions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ..errors import BenchError, FormatError
from .compiles import CompileCounter
from .conditions import conditions as current_conditions
from .stats import Stats, describe

#: ``BenchResult.status`` of a measurement with no compile in its timed window.
OK = "ok"
#: ``BenchResult.status`` when something compiled while the clock ran.
INVALID = "invalid"

#: The most calls one sample repeats.
MAX_LOOPS = 1_000_000

_MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "temp_size_in_bytes",
    "alias_size_in_bytes",
    "generated_code_size_in_bytes",
)


@dataclasses.dataclass(frozen=True)
class Timer:
    """The clocks a measurement reads: wall seconds and process CPU seconds.

    The default reads ``time.perf_counter`` and ``time.process_time``; a test
    passes clocks that a fake device advances, so that no verdict it checks
    depends on how busy the machine is.

    Attributes:
      wall: seconds on a monotonic wall clock.
      cpu: seconds of CPU time of this process.

    Example:
      >>> t = {"now": 0.0}
      >>> def tick():
      ...     t["now"] += 0.5
      >>> timed(tick, 2, Timer(wall=lambda: t["now"], cpu=lambda: t["now"]))
      (0.5, 0.5)
    """

    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float] = time.process_time


#: The real clocks.
SYSTEM_TIMER = Timer()


@dataclasses.dataclass(frozen=True)
class Target:
    """A function and the arguments to benchmark it on.

    Attributes:
      fn: the function. With ``jit=True`` it is jitted (an already jitted
        function is used as it is); with ``jit=False`` it is called as given
        and may call jitted functions itself.
      args: the positional arguments.
      name: how results name it (the function's name by default).
      jit: whether ``run`` compiles ``fn`` ahead of time.

    Example:
      >>> import jax.numpy as jnp
      >>> Target(jnp.sin, (jnp.ones(3),)).label
      'sin'
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    name: str | None = None
    jit: bool = True

    @property
    def label(self) -> str:
        return self.name or getattr(self.fn, "__name__", None) or type(self.fn).__name__


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_duration(x: Any) -> bool:
    return _is_number(x) and math.isfinite(x) and x >= 0


class _Fields:
    """The fields of one object read from a file, each checked for its type."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def get(self, key: str, kinds: tuple[type, ...], *, optional: bool = False) -> Any:
        """``data[key]``, of one of ``kinds``; None for an optional one absent or null.

        Raises:
          FormatError: naming the field that is missing or of the wrong type.
        """
        if key not in self.data:
            if optional:
                return None
            raise FormatError(
                f"{self.where}: no {key!r}", hint="write it with treeguard.bench.save"
            )
        value = self.data[key]
        if value is None and optional:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise FormatError(
                f"{self.where}[{key!r}]: a {type(value).__name__}, expected "
                f"{' or '.join(k.__name__ for k in kinds)}"
            )
        return value


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """One benchmark's outcome.

    Attributes:
      name: what was measured.
      status: ``"ok"``, or ``"invalid"`` when anything compiled during the
        timed samples.
      reason: why it is invalid (empty when ok).
      samples_s: each sample's time per call, in seconds, in run order.
      loops: calls per sample.
      warmup: warm-up calls before calibration.
      phases: ``trace_s``, ``lower_s``, ``compile_s`` and ``first_call_s``
        (None where not measured).
      compiles: traces, lowerings and compiles seen during ``warmup`` and
        during ``measure``, by kind.
      memory: the compiled program's ``memory_analysis()`` in bytes
        (``argument``, ``output``, ``temp``, ``alias``, ``generated_code``),
        or None when the backend gives none.
      cost: ``cost_analysis()``'s ``flops``, ``transcendentals`` and
        ``bytes_accessed``, or None.
      conditions: the machine's conditions (``treeguard.bench.conditions``).
      meta: free-form labels (the batch, the model).
      cpu_samples_s: each sample's process CPU time per call (every thread
        of this process, XLA's included), beside ``samples_s``. On the CPU
        backend it does not count the time the machine's neighbours took.
    """

    name: str
    status: str
    reason: str
    samples_s: tuple[float, ...]
    loops: int
    warmup: int
    phases: dict[str, float | None]
    compiles: dict[str, dict[str, int]]
    memory: dict[str, int] | None
    cost: dict[str, float] | None
    conditions: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    cpu_samples_s: tuple[float, ...] = ()

    def samples(self, clock: str = "wall") -> tuple[float, ...]:
        """The samples of ``clock``: ``"wall"`` (``samples_s``) or ``"cpu"``.

        Raises:
          BenchError: for another clock, or ``"cpu"`` on a result without CPU times.
        """
        if clock == "wall":
            return self.samples_s
        if clock == "cpu" and self.cpu_samples_s:
            return self.cpu_samples_s
        if clock == "cpu":
            raise BenchError(
                f"{self.name}: no CPU times recorded", hint="compare with clock='wall'"
            )
        raise BenchError(f"clock={clock!r}", hint="'wall' or 'cpu'")

    @property
    def valid(self) -> bool:
        """Whether nothing compiled during the timed samples."""
        return self.status == OK

    @functools.cached_property
    def stats(self) -> Stats:
        """The distribution of ``samples_s``."""
        return describe(self.samples_s)

    @property
    def flops_per_s(self) -> float | None:
        """Achieved FLOP/s at the median, when the cost analysis gives FLOPs."""
        flops = (self.cost or {}).get("flops")
        if not flops or self.stats.median <= 0:
            return None
        return float(flops) / self.stats.median

    @property
    def compile_total_s(self) -> float:
        """Tracing, lowering and compiling together (the first call apart)."""
        return sum(self.phases.get(k) or 0.0 for k in ("trace_s", "lower_s", "compile_s"))

    def to_dict(self, *, with_conditions: bool = True) -> dict[str, Any]:
        """The JSON form of one result (see ``treeguard.bench.save_results``)."""
        out: dict[str, Any] = {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "loops": self.loops,
            "warmup": self.warmup,
            "phases": dict(self.phases),
            "compiles": {k: dict(v) for k, v in self.compiles.items()},
            "memory": None if self.memory is None else dict(self.memory),
            "cost": None if self.cost is None else dict(self.cost),
            "flops_per_s": self.flops_per_s,
            "stats": self.stats.to_dict(),
            "samples_s": list(self.samples_s),
            "cpu_samples_s": list(self.cpu_samples_s),
            "meta": dict(self.meta),
        }
        if with_conditions:
            out["conditions"] = dict(self.conditions)
        return out

    @classmethod
    def from_dict(cls, data: Any, /, *, where: str = "result") -> BenchResult:
        """Reads ``to_dict``'s form back, checking every field's type.

        Raises:
          FormatError: naming the field that is missing or of the wrong type.
        """
        if not isinstance(data, dict):
            raise FormatError(f"{where}: a {type(data).__name__}, not an object")
        get = _Fields(data, where).get
        samples = get("samples_s", (list,))
        if not samples or not all(map(_is_duration, samples)):
            raise FormatError(f"{where}['samples_s']: expected a non-empty list of durations >= 0")
        cpu = get("cpu_samples_s", (list,), optional=True) or []
        if not all(map(_is_duration, cpu)):
            raise FormatError(f"{where}['cpu_samples_s']: expected a list of durations >= 0")
        status = get("status", (str,))
        if status not in (OK, INVALID):
            raise FormatError(f"{where}['status']: {status!r}, expected 'ok' or 'invalid'")
        loops = get("loops", (int,))
        if loops < 1:
            raise FormatError(f"{where}['loops']: {loops}, expected an int >= 1")
        phases = get("phases", (dict,))
        for k, v in phases.items():
            if v is not None and not _is_number(v):
                raise FormatError(f"{where}['phases'][{k!r}]: a {type(v).__name__}")
        compiles = get("compiles", (dict,))
        for k, v in compiles.items():
            if not isinstance(v, dict) or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in v.values()
            ):
                raise FormatError(f"{where}['compiles'][{k!r}]: expected counts by kind")
        numbers: dict[str, Any] = {}
        for key in ("memory", "cost"):
            table = get(key, (dict,), optional=True)
            if table is not None and not all(
                _is_number(v) and math.isfinite(v) for v in table.values()
            ):
                raise FormatError(f"{where}[{key!r}]: expected numbers by name")
            numbers[key] = table
        return cls(
            name=get("name", (str,)),
            status=status,
            reason=get("reason", (str,), optional=True) or "",
            samples_s=tuple(float(s) for s in samples),
            loops=loops,
            warmup=get("warmup", (int,), optional=True) or 0,
            phases={str(k): None if v is None else float(v) for k, v in phases.items()},
            compiles={str(k): {str(a): int(b) for a, b in v.items()} for k, v in compiles.items()},
            memory=numbers["memory"],
            cost=numbers["cost"],
            conditions=get("conditions", (dict,), optional=True) or {},
            meta=get("meta", (dict,), optional=True) or {},
            cpu_samples_s=tuple(float(c) for c in cpu),
        )


def _memory(compiled: Any) -> dict[str, int] | None:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis gives none
        return None
    if stats is None:
        return None
    out = {}
    for field in _MEMORY_FIELDS:
        value = getattr(stats, field, None)
        if isinstance(value, int):
            out[field.removesuffix("_size_in_bytes")] = value
    return out or None


def _cost(compiled: Any) -> dict[str, float] | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis gives none
        return None
    if isinstance(cost, Sequence) and cost:  # older JAX: one dict per program
        cost = cost[0]
    if not isinstance(cost, dict):
        return None
    out = {}
    for key, name in (
        ("flops", "flops"),
        ("transcendentals", "transcendentals"),
        ("bytes accessed", "bytes_accessed"),
    ):
        value = cost.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
            out[name] = float(value)
    return out or None


def check_options(samples: int, min_time: float, warmup: int) -> None:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise BenchError(f"samples={samples!r}", hint="pass an int >= 1 (30 is the default)")
    if not _is_duration(min_time):
        raise BenchError(f"min_time={min_time!r}", hint="pass seconds >= 0 per sample")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise BenchError(f"warmup={warmup!r}", hint="pass an int >= 0")


def timed(call: Callable[[], Any], loops: int, timer: Timer = SYSTEM_TIMER) -> tuple[float, float]:
    """Wall and process CPU seconds per call over ``loops`` calls, each
    awaited inside the clocks."""
    start, cpu = timer.wall(), timer.cpu()
    for _ in range(loops):
        jax.block_until_ready(call())  # type: ignore[no-untyped-call]
    return (timer.wall() - start) / loops, (timer.cpu() - cpu) / loops


def calibrate(call: Callable[[], Any], min_time: float, timer: Timer = SYSTEM_TIMER) -> int:
    """The number of calls that makes one sample last at least ``min_time``.

    Example:
      >>> calibrate(lambda: None, 0.0)
      1
    """
    if min_time <= 0:
        return 1
    loops = 1
    while True:
        per_call = timed(call, loops, timer)[0]
        if per_call * loops >= min_time or loops >= MAX_LOOPS:
            return loops
        wanted = math.ceil(min_time / max(per_call, 1e-9) * 1.05)
        loops = min(MAX_LOOPS, max(wanted, loops * 2))


@dataclasses.dataclass
class Prepared:
    """A target ready to time: its call, phases, analyses and warm-up compiles."""

    name: str
    call: Callable[[], Any]
    phases: dict[str, float | None]
    memory: dict[str, int] | None
    cost: dict[str, float] | None
    warmup_compiles: CompileCounter


def prepare(fn: Callable[..., Any], args: Sequence[Any], *, jit: bool, warmup: int) -> Prepared:
    """Times the phases of ``fn`` on ``args`` and warms it up.

    Returns:
      The ``Prepared`` target; every compile it saw is a warm-up compile.
    """
    name = getattr(fn, "__name__", None) or type(fn).__name__
    args = tuple(args)
    counter = CompileCounter()
    with counter:
        if jit:
            jitted: Any = fn if hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn)
            t0 = time.perf_counter()
            traced = jitted.trace(*args)
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            compiled = lowered.compile()
            t3 = time.perf_counter()
            jax.block_until_ready(jitted(*args))  # type: ignore[no-untyped-call]
            t4 = time.perf_counter()
            phases: dict[str, float | None] = {
                "trace_s": t1 - t0,
                "lower_s": t2 - t1,
                "compile_s": t3 - t2,
                "first_call_s": t4 - t3,
            }
            memory, cost = _memory(compiled), _cost(compiled)

            def call() -> Any:
                return jitted(*args)
        else:

            def call() -> Any:
                return fn(*args)

            t0 = time.perf_counter()
            jax.block_until_ready(call())  # type: ignore[no-untyped-call]
            first = time.perf_counter() - t0
            phases = {
                "trace_s": counter.seconds["trace"] if counter.counts["trace"] else None,
                "lower_s": counter.seconds["lower"] if counter.counts["lower"] else None,
                "compile_s": counter.seconds["compile"] if counter.counts["compile"] else None,
                "first_call_s": first,
            }
            memory = cost = None
        for _ in range(warmup):
            jax.block_until_ready(call())  # type: ignore[no-untyped-call]
    return Prepared(name, call, phases, memory, cost, counter)


def measure(
    call: Callable[[], Any], *, samples: int, loops: int, timer: Timer = SYSTEM_TIMER
) -> tuple[list[tuple[float, float]], Any]:
    """``samples`` timed samples of ``loops`` calls each, counting compiles.

    Returns:
      The wall and CPU seconds per call of each sample and the
      ``CompileCounter`` of the timed window.
    """
    out = []
    with CompileCounter() as counter:
        for _ in range(samples):
            out.append(timed(call, loops, timer))
    return out, counter


def invalid_reason(counter: CompileCounter) -> str:
    """Why a timed window with compile events is invalid, or "" when it had none."""
    if not counter.total:
        return ""
    parts = [f"{counter.counts[k]} {k}(s)" for k in ("trace", "lower", "compile")]
    return (
        f"{', '.join(parts)} during the timed samples; the times include compilation. "
        "hint: keep shapes, dtypes and weak types of the arguments fixed, and reuse one "
        "jitted function (JAX_EXPLAIN_CACHE_MISSES=1 names the cause)"
    )


def result_from(
    prepared: Prepared,
    samples: list[tuple[float, float]],
    counter: CompileCounter,
    *,
    loops: int,
    warmup: int,
    name: str,
    conds: dict[str, Any],
    meta: dict[str, Any] | None = None,
) -> BenchResult:
    """Assembles a ``BenchResult`` from a prepared target and its timed window."""
    reason = invalid_reason(counter)
    return BenchResult(
        name=name,
        status=INVALID if reason else OK,
        reason=reason,
        samples_s=tuple(w for w, _ in samples),
        cpu_samples_s=tuple(c for _, c in samples),
        loops=loops,
        warmup=warmup,
        phases=prepared.phases,
        compiles={
            "warmup": dict(prepared.warmup_compiles.counts),
            "measure": dict(counter.counts),
        },
        memory=prepared.memory,
        cost=prepared.cost,
        conditions=conds,
        meta=dict(meta or {}),
    )


def run(
    fn: Callable[..., Any],
    *args: Any,
    samples: int = 30,
    min_time: float = 0.05,
    warmup: int = 2,
    jit: bool = True,
    name: str | None = None,
    conditions: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    timer: Timer = SYSTEM_TIMER,
) -> BenchResult:
    """Benchmarks ``fn(*args)``: phases apart, then calibrated, awaited samples.

    Args:
      fn: the function. With ``jit=True`` it is compiled ahead of time
        (``jax.jit(fn).trace(*args).lower().compile()``, each phase timed)
        and the samples call the jitted function, so a recompile would be
        seen; with ``jit=False`` it is called as given, and the phases are
        the trace, lowering and compile events of its first call.
      *args: its arguments, fixed for every call.
      samples: how many timed samples.
      min_time: the least seconds one sample lasts; calls are repeated
        within a sample to reach it.
      warmup: calls after the first one before calibration.
      jit: see ``fn``.
      name: how the result names it (the function's name by default).
      conditions: the machine's conditions, when the caller collected them
        already (``treeguard.bench.conditions()``).
      meta: labels stored with the result.
      timer: the clocks the samples read (the real ones by default).

    Returns:
      The ``BenchResult``; ``status`` is ``"invalid"`` when anything was
      traced or compiled during the timed samples.

    Raises:
      BenchError: for a bad ``samples``, ``min_time`` or ``warmup``.

    Example:
      >>> import jax.numpy as jnp
      >>> r = run(jnp.sin, jnp.ones(8), samples=5, min_time=0.0)
      >>> r.status, r.stats.n, r.compiles["measure"]["compile"]
      ('ok', 5, 0)
      >>> sorted(r.phases)
      ['compile_s', 'first_call_s', 'lower_s', 'trace_s']
    """
    check_options(samples, min_time, warmup)
    conds = current_conditions() if conditions is None else conditions
    prepared = prepare(fn, args, jit=jit, warmup=warmup)
    with prepared.warmup_compiles:
        loops = calibrate(prepared.call, min_time, timer)
    times, counter = measure(prepared.call, samples=samples, loops=loops, timer=timer)
    return result_from(
        prepared,
        times,
        counter,
        loops=loops,
        warmup=warmup,
        name=name or prepared.name,
        conds=conds,
        meta=meta,
    )


def run_target(
    target: Target,
    *,
    samples: int = 30,
    min_time: float = 0.05,
    conditions: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> BenchResult:
    """Benchmarks a ``Target`` with :func:`run` (as its ``jit`` says, named by its label).

    Args:
      target: what to time.
      samples, min_time, conditions, meta: as for :func:`run`.

    Returns:
      Its ``BenchResult``.

    Raises:
      BenchError: for a bad ``samples`` or ``min_time``.

    Example:
      >>> run_target(Target(jax.numpy.cos, (jax.numpy.ones(4),)), samples=3, min_time=0.0).name
      'cos'
    """
    return run(
        target.fn,
        *target.args,
        samples=samples,
        min_time=min_time,
        jit=target.jit,
        name=target.label,
        conditions=conditions,
        meta=meta,
    )
