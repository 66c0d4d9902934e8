"""What every checked step shares: validation once per signature, the
compiled step, and the traced tail that guards against NaN and Inf.

A checked step (``updater``, ``apply_updates``, ``optax_step``) hands its
trees straight to one ``jax.jit`` function, whose C++ dispatch finds the
compiled step for the call's signature (treedefs, shapes, dtypes, weak
types) as fast as a raw jitted ``tree.map``. Validation runs when a new
signature is traced: structure, shapes and dtypes of every tree against the
params, and the step's own results (a promoted or broadcast result, a
drifting optimizer state). It raises before anything is computed, so a
repeated call pays nothing for it.

Two checks need the host. Every tree is walked for cycles before JAX sees it
(JAX's flatten does not survive a cycle). With several devices, each call
also reads the leaves' shardings: a new combination of shardings gets its own
compiled step, pinned to the params' shardings. Errors JAX raises about the
arguments themselves (a leaf that is no array, a leaked tracer, a donated
buffer) are diagnosed on the host and re-raised naming the key path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from .diff import mismatches
from .errors import InvalidTreeError, NonFiniteError, TreeguardError, TreeMismatchError
from .mismatch import Mismatch
from .nonfinite import all_finite, describe_counts, find_nonfinite, is_inexact
from .paths import keystr
from .spec import describe_sharding, invalid_leaves_hint, summarize
from .walk import assert_acyclic, flatten, invalid_leaves, structure_of

DtypePolicy: TypeAlias = Literal["strict", "cast"]
OnNonfinite: TypeAlias = Literal["raise", "skip", "ignore"]

_DTYPE_POLICIES = ("strict", "cast")
_ON_NONFINITE = ("raise", "skip", "ignore")
#: Mismatch kinds that make two trees incompatible for an update.
_LAYOUT = frozenset(("missing", "unexpected", "node_type", "node_data", "shape", "dim"))
#: How many distinct sharding combinations one step keeps compiled.
MAX_SHARDINGS = 32

_CAST_HINT = (
    'pass dtype_policy="cast" to cast on purpose (each cast is reported), '
    "or fix the dtype where {what} are built"
)
_INT_HINT = (
    "integer or bool params cannot take a float or complex update; leave them out of the "
    "update (e.g. optax.masked) or keep them outside the params"
)
TRACED_RAISE = (
    'on_nonfinite="raise" needs concrete values, but the step was called inside a JAX '
    'transformation; hint: pass on_nonfinite="skip" (keeps the old values, traceable) or '
    '"ignore", or call the step outside jit'
)


def _shape(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else np.shape(x)


@dataclasses.dataclass(frozen=True)
class Cast:
    """One cast done on purpose under ``dtype_policy="cast"``.

    Attributes:
      path: the leaf's key path in ``keystr`` form.
      source: the dtype name it had.
      target: the dtype name it was cast to (always its param's dtype).
      where: what was cast, e.g. ``"the updates"`` or ``"fn's result"``.

    Example:
      >>> Cast("['w']", "float32", "bfloat16", "the updates").describe()
      "['w']: float32 -> bfloat16 in the updates"
    """

    path: str
    source: str
    target: str
    where: str

    def describe(self) -> str:
        """One line: ``['w']: float32 -> bfloat16 in the updates``."""
        return f"{self.path or '<root>'}: {self.source} -> {self.target} in {self.where}"


def check_options(dtype_policy: str, on_nonfinite: str) -> None:
    if dtype_policy not in _DTYPE_POLICIES:
        raise ValueError(f"dtype_policy must be one of {_DTYPE_POLICIES}, not {dtype_policy!r}")
    if on_nonfinite not in _ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {_ON_NONFINITE}, not {on_nonfinite!r}")


def mismatch_error(
    found: Sequence[Mismatch], *, expected_from: str, actual_from: str, hint: str | None = None
) -> TreeMismatchError:
    """A ``TreeMismatchError`` that ends with ``hint`` (or the guessed one)."""
    return TreeMismatchError(found, expected_from=expected_from, actual_from=actual_from, hint=hint)


@functools.cache
def _multi_device() -> bool:
    """Whether arrays can live on more than one device, so shardings can differ."""
    return jax.device_count() > 1 or jax.default_backend() != "cpu"


def _sharding_of(x: Any) -> Any:
    try:
        return x.sharding
    except AttributeError:  # numpy arrays, Python numbers, tracers
        return None


def _devices_text(sharding: Any) -> str:
    ids = sorted(d.id for d in sharding.device_set)
    platform = next(iter(sharding.device_set)).platform
    if len(ids) == 1:
        return f"{platform}:{ids[0]}"
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{platform}:{ids[0]}-{ids[-1]}"
    return f"{platform}:{','.join(map(str, ids))}"


class _Sharded:
    """Stands for an array in ``describe_sharding`` so a sharding reads the same
    way here as in a spec."""

    __slots__ = ("sharding",)

    def __init__(self, sharding: Any) -> None:
        self.sharding = sharding


def sharding_text(sharding: Any) -> str:
    """A sharding with the devices it spans: ``single on cpu:1``."""
    return f"{describe_sharding(_Sharded(sharding))} on {_devices_text(sharding)}"


def scalar_key(v: Any) -> Any:
    if isinstance(v, (bool, int, float, complex)):
        return type(v)
    aval = getattr(v, "aval", None)
    if aval is not None:
        return aval
    if isinstance(v, (np.ndarray, np.generic)):
        return ("numpy", np.shape(v), v.dtype)
    return ("invalid", type(v))


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def leaf_dtype(x: Any) -> np.dtype[Any]:
    return np.dtype(jnp.result_type(x))


def same_kind(source: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether ``source`` may be cast to ``target`` without changing kind
    (float to float, int to float; never float to int)."""
    return bool(jnp.can_cast(source, target, casting="same_kind"))


@dataclasses.dataclass(frozen=True)
class Layout:
    """The parts of one call the checks need: a label and the flat leaves."""

    label: str
    tree: Any
    leaves: list[Any]
    treedef: Any

    def paths(self) -> list[str]:
        return [keystr(p) for p in structure_of(self.tree, self.treedef).leaf_paths()]


def _leaf_paths(lay: Layout) -> list[Any]:
    return structure_of(lay.tree, lay.treedef).leaf_paths()


def check_arrays(layouts: Sequence[Layout]) -> None:
    """Refuses leaves that are not arrays, in every tree at once."""
    problems: list[tuple[str, str]] = []
    for lay in layouts:
        found = invalid_leaves(lay.leaves, functools.partial(_leaf_paths, lay))
        problems += [(p, f"{d} (in {lay.label})") for p, d in found]
    if problems:
        hints = {invalid_leaves_hint(lay.tree) for lay in layouts}
        eqx = next((h for h in hints if "equinox" in h), None)  # save's hint for a module
        raise InvalidTreeError(
            problems,
            hint=eqx
            or "pass arrays only; hold config and Python objects outside the trees you update",
        )


def check_layout(ref: Layout, others: Sequence[Layout]) -> None:
    """Refuses trees whose structure or leaf shapes differ from ``ref``'s,
    listing every path in every tree before any arithmetic."""
    bad: list[Layout] = []
    for lay in others:
        if lay.treedef != ref.treedef or any(
            _shape(a) != _shape(b) for a, b in zip(ref.leaves, lay.leaves)
        ):
            bad.append(lay)
    if not bad:
        return
    found: list[Mismatch] = []
    for lay in bad:
        ms = [m for m in mismatches(lay.tree, ref.tree) if m.kind in _LAYOUT]
        found += ms or [Mismatch("", "node_data", "the params' treedef", "another treedef")]
    raise mismatch_error(
        found,
        expected_from=ref.label,
        actual_from=" and ".join(lay.label for lay in bad),
        hint=None
        if any(m.kind != "shape" for m in found)
        else "an update of another shape would broadcast silently; build it with the "
        "params' shape (or reduce it to that shape on purpose)",
    )


def plan_casts(
    ref: Layout, others: Sequence[Layout], policy: DtypePolicy
) -> tuple[dict[tuple[int, int], np.dtype[Any]], list[Cast]]:
    """Compares every leaf's dtype with its param's under ``policy``.

    Returns:
      ``{(tree index, leaf index): target dtype}`` for the casts to do, and
      their ``Cast`` records.

    Raises:
      TreeMismatchError: under ``"strict"`` for any dtype that differs, and
        under ``"cast"`` for a cast that would change the kind (float to int).
    """
    ref_dtypes = [leaf_dtype(x) for x in ref.leaves]
    differ = [
        (j, i, leaf_dtype(x), ref_dtypes[i])
        for j, lay in enumerate(others)
        for i, x in enumerate(lay.leaves)
        if leaf_dtype(x) != ref_dtypes[i]
    ]
    if not differ:
        return {}, []
    paths = ref.paths()
    refused = [d for d in differ if policy == "strict" or not same_kind(d[2], d[3])]
    if refused:
        found = [Mismatch(paths[i], "dtype", t.name, s.name) for _, i, s, t in refused]
        labels = sorted({others[j].label for j, *_ in refused})
        what = " and ".join(labels).removeprefix("the ")
        if any(not is_inexact(t) and is_inexact(s) for _, _, s, t in refused):
            hint = _INT_HINT
        elif policy == "strict":
            hint = _CAST_HINT.format(what=what)
        else:
            hint = (
                f"these casts would change the kind of number; fix the dtype where {what} are built"
            )
        raise mismatch_error(
            found, expected_from=ref.label, actual_from=" and ".join(labels), hint=hint
        )
    plan = {(j, i): t for j, i, _, t in differ}
    casts = [Cast(paths[i], s.name, t.name, others[j].label) for j, i, s, t in differ]
    return plan, casts


def plan_shardings(ref: Layout, others: Sequence[Layout]) -> list[Any] | None:
    """The params' shardings, to pin every result leaf to its param's sharding.

    An update leaf on the same devices as its param but laid out differently
    is resharded inside the compiled step. One on other devices is refused.

    Returns:
      One sharding (or None) per leaf, or None when nothing needs pinning
      (one device, or the call runs inside a transformation).

    Raises:
      TreeMismatchError: kind ``sharding`` for every leaf on other devices.
    """
    if not _multi_device():
        return None
    if any(is_tracer(x) for lay in (ref, *others) for x in lay.leaves):
        return None
    # an uncommitted array (jnp.zeros(()) in an optimizer state) may move freely
    ref_sh = [_sharding_of(x) if getattr(x, "committed", True) else None for x in ref.leaves]
    found: list[tuple[int, Any, Any, str]] = []
    for lay in others:
        for i, x in enumerate(lay.leaves):
            sh, want = _sharding_of(x), ref_sh[i]
            if sh is not None and want is not None and sh.device_set != want.device_set:
                found.append((i, want, sh, lay.label))
    if found:
        paths = ref.paths()
        raise mismatch_error(
            [
                Mismatch(paths[i], "sharding", sharding_text(w), sharding_text(s))
                for i, w, s, _ in found
            ],
            expected_from=ref.label,
            actual_from=" and ".join(sorted({lbl for *_, lbl in found})),
            hint="the update lives on other devices than its param; move it first with "
            "jax.device_put(updates, jax.tree.map(lambda p: p.sharding, params))",
        )
    return ref_sh if any(s is not None for s in ref_sh) else None


def check_scalars(scalars: dict[str, Any]) -> None:
    """Keyword arguments are hyperparameters: numbers or 0-d arrays."""
    bad_type = [
        (k, v)
        for k, v in scalars.items()
        if isinstance(scalar_key(v), tuple) and scalar_key(v)[0] == "invalid"
    ]
    if bad_type:
        raise InvalidTreeError(
            [
                (f"{k}=", f"keyword argument of type {type(v).__name__} is not a number or array")
                for k, v in bad_type
            ],
            hint="keyword arguments are scalar hyperparameters such as lr=0.01",
        )
    bad_shape = [(k, v) for k, v in scalars.items() if np.shape(v) != ()]
    if bad_shape:
        raise mismatch_error(
            [Mismatch(f"{k}=", "shape", (), tuple(np.shape(v))) for k, v in bad_shape],
            expected_from="a scalar hyperparameter",
            actual_from="the keyword arguments",
            hint="keyword arguments are passed to every leaf and must be scalars; pass a "
            "per-leaf value as a tree, positionally",
        )


def finish_step(
    new: list[Any],
    old: list[Any],
    on_nonfinite: OnNonfinite,
    donate: bool,
    skipped: Any,
) -> tuple[list[Any], Any]:
    """Traced tail of a step: checks ``new`` for NaN/Inf and keeps ``old``
    when the step must not be applied.

    The check is one fused reduction over all leaves of a dtype (a per-leaf
    reduction compiles far slower on trees of thousands of leaves); which
    leaves hold what is worked out on the host, on the error path only.

    Returns:
      The leaves to return and the extra output: ``()`` for ``"ignore"``,
      the new skip count for ``"skip"``, the all-finite flag for ``"raise"``.
    """
    if on_nonfinite == "ignore":
        return new, ()
    ok = all_finite(new)
    if on_nonfinite == "skip" or donate:
        new = jax.lax.cond(ok, lambda a, b: list(a), lambda a, b: list(b), new, old)
    if on_nonfinite == "skip":
        return new, skipped + jnp.logical_not(ok).astype(jnp.int32)
    return new, ok


def pin(leaves: list[Any], shardings: list[Any] | None) -> list[Any]:
    """Constrains each leaf to its sharding inside a trace."""
    if shardings is None:
        return leaves
    return [
        y if s is None else jax.lax.with_sharding_constraint(y, s)  # type: ignore[no-untyped-call]
        for y, s in zip(leaves, shardings)
    ]


def nonfinite_error(
    checked: Sequence[Layout],
    *,
    params: Any,
    state: Any = None,
    donate: bool,
) -> NonFiniteError:
    """Builds the error for a refused step, naming the leaves that hold NaN
    or Inf in each tree of ``checked`` (the step's results, or with donated
    buffers, where the results are gone, its inputs).

    Args:
      checked: the trees to search, labelled.
      params: the params from before the step (what the caller keeps).
      state: the optimizer state from before the step, if any.
      donate: whether the caller's buffers were donated.
    """
    sections: list[str] = []
    found_all: list[dict[str, int]] = []
    for lay in checked:
        found = find_nonfinite(lay.tree)
        found_all.append(found)
        if found:
            text = describe_counts(found, lay.leaves, lay.paths(), where=lay.label, hint="")
            sections.append(text.removesuffix("\nhint: "))
    if not sections:
        sections.append("the step produced NaN or Inf from finite inputs")
    kept = "the error's .params hold" if donate else "your params hold"
    text = "\n".join(sections)
    text += (
        f"\nhint: the step was not applied ({kept} the values from before it); find the "
        'source with treeguard.find_nonfinite(grads), or pass on_nonfinite="skip" to skip '
        "such steps"
    )
    return NonFiniteError(
        text,
        counts=found_all[0],
        state_counts=found_all[1] if len(found_all) > 1 else {},
        params=params,
        state=state,
    )


def diagnose(
    error: Exception, layouts: Callable[[], Sequence[Layout]], hyper: dict[str, Any]
) -> None:
    """Turns JAX's complaint about a step's arguments into an error that names
    the key path; returns (so the caller re-raises) when it finds nothing."""
    if isinstance(error, TreeguardError):
        return
    lays = layouts()
    try:
        check_arrays(lays)
        check_scalars(hyper)
    except TreeguardError as e:
        raise e from error
    problems: list[tuple[str, str]] = []
    hint = "with donate=True, pass the params the previous step returned, not the old ones"
    for lay in lays:
        for x, path in zip(lay.leaves, lay.paths()):
            if not is_tracer(x) and getattr(x, "is_deleted", lambda: False)():
                what = summarize(tuple(x.shape), np.dtype(x.dtype))
                problems.append(
                    (
                        path,
                        f"{what} was deleted, probably donated to an earlier step (in {lay.label})",
                    )
                )
    if not problems and isinstance(error, jax.errors.UnexpectedTracerError):
        hint = "return values out of jit/vmap/grad instead of storing them from inside"
        for lay in lays:
            for x, path in zip(lay.leaves, lay.paths()):
                if is_tracer(x):
                    what = summarize(tuple(x.shape), np.dtype(x.dtype))
                    problems.append(
                        (
                            path,
                            f"{what} is a tracer that leaked out of a finished "
                            f"transformation (in {lay.label})",
                        )
                    )
    if not problems and isinstance(error, ValueError) and "devices" in str(error):
        plan_shardings(lays[0], [lay for lay in lays[1:] if lay.treedef == lays[0].treedef])
    if problems:
        raise InvalidTreeError(problems, hint=hint) from error


def run_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    layouts: Callable[[], Sequence[Layout]],
    hyper: dict[str, Any],
) -> Any:
    """Calls a compiled step. A treeguard error raised while tracing comes out
    as raised (without JAX's note about its own frames); JAX's errors about the
    arguments go through ``diagnose``."""
    try:
        return fn(*args)
    except TreeguardError as e:
        notes = getattr(e, "__notes__", None)
        if notes:
            notes[:] = [n for n in notes if "JAX has removed its internal frames" not in n]
        raise
    except (TypeError, ValueError, RuntimeError) as e:
        diagnose(e, layouts, hyper)
        raise


def host_layouts(labelled: Sequence[tuple[str, Any]]) -> list[Layout]:
    """Flattens each ``(label, tree)`` for a check on the host."""
    out = []
    for label, tree in labelled:
        leaves, treedef = flatten(tree)
        out.append(Layout(label, tree, leaves, treedef))
    return out


class CheckedStep:
    """What every checked step shares: options, the compiled functions, the
    compile count, the skip count and the cast report.

    Subclasses provide ``_body(shardings)``, the traced step, and
    ``_donated``, the argument positions donated with ``donate=True``.
    """

    _donated: tuple[int, ...] = (0,)

    def __init__(
        self, *, dtype_policy: DtypePolicy, donate: bool, on_nonfinite: OnNonfinite
    ) -> None:
        check_options(dtype_policy, on_nonfinite)
        self.dtype_policy: DtypePolicy = dtype_policy
        self.donate = bool(donate)
        self.on_nonfinite: OnNonfinite = on_nonfinite
        self._jit: Callable[..., Any] | None = None
        self._by_sharding: dict[Any, Callable[..., Any]] = {}
        self._multi: bool | None = None
        self._traces = 0
        self._skipped: Any = None
        self._casts: dict[tuple[str, str, str, str], Cast] = {}

    @property
    def compile_count(self) -> int:
        """How many times the step has been traced and compiled: once per
        distinct signature (structure, shapes, dtypes, weak types, the x64
        setting and, with several devices, shardings). It stays put over
        steps with one signature."""
        return self._traces

    @property
    def skipped(self) -> int:
        """How many steps ``on_nonfinite="skip"`` has skipped. Counted on the
        device, so reading it waits for the steps so far; calls made inside
        an outer ``jit`` or ``vmap`` are not counted."""
        return 0 if self._skipped is None else int(self._skipped)

    @property
    def casts(self) -> tuple[Cast, ...]:
        """Every distinct cast done under ``dtype_policy="cast"``, over all
        signatures compiled so far, in the order first seen."""
        return tuple(self._casts.values())

    def _record(self, casts: Sequence[Cast]) -> None:
        for c in casts:
            self._casts.setdefault((c.path, c.source, c.target, c.where), c)

    def _body(self, shardings: Sequence[list[Any] | None] | None) -> Callable[..., Any]:
        """The traced step; each concrete step (``Updater``, ``OptaxStep``) defines it."""
        raise NotImplementedError  # abstract: CheckedStep is never called directly

    def _compiled(
        self, labelled: Callable[[], Sequence[tuple[str, Any]]], trees: Sequence[Any]
    ) -> Callable[..., Any]:
        """The jitted step for this call: one for all signatures on a single
        device; one per combination of shardings with several devices."""
        if self._multi is None:
            self._multi = _multi_device()
        if not self._multi:
            if self._jit is None:
                self._jit = self._make(None)
            return self._jit
        leaf_lists = [jax.tree.leaves(t) for t in trees]
        key = tuple(tuple(map(_sharding_of, leaves)) for leaves in leaf_lists)
        fn = self._by_sharding.get(key)
        if fn is None:
            lays = host_layouts(labelled())
            shardings = plan_shardings_all(lays, self._pinned_groups())
            fn = self._make(shardings)
            if len(self._by_sharding) >= MAX_SHARDINGS:
                self._by_sharding.pop(next(iter(self._by_sharding)))
            self._by_sharding[key] = fn
        return fn

    def _pinned_groups(self) -> Sequence[tuple[int, Sequence[int]]]:
        """``(tree, trees matched against it)`` pairs whose results are pinned
        to the first tree's shardings; the params by default."""
        return ((0, (1,)),)

    def _make(self, shardings: Sequence[list[Any] | None] | None) -> Callable[..., Any]:
        return jax.jit(self._body(shardings), donate_argnums=self._donated if self.donate else ())

    def _skip_in(self) -> Any:
        if self._skipped is None:
            self._skipped = jnp.zeros((), jnp.int32)
        return self._skipped

    def _skip_out(self, new: Any) -> None:
        if not is_tracer(new):
            self._skipped = new


def check_acyclic(trees: Sequence[Any]) -> None:
    """Refuses a tree that contains itself before JAX flattens it."""
    for t in trees:
        assert_acyclic(t)


def plan_shardings_all(
    lays: Sequence[Layout], groups: Sequence[tuple[int, Sequence[int]]]
) -> list[list[Any] | None]:
    """For each group ``(ref, matched)``: checks the matched trees' devices
    against the ref tree's and returns the ref tree's shardings to pin."""
    out: list[list[Any] | None] = []
    for ref, matched in groups:
        out.append(plan_shardings(lays[ref], [lays[j] for j in matched]))
    return out
