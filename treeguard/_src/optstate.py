"""Optimizer state that follows the params: ``migrate_opt_state``.

An optax state holds trees that mirror the params (adam's ``mu`` and
``nu``, momentum's trace; inside ``chain``, ``multi_transform``,
``inject_hyperparams`` and ``masked`` states alike) beside leaves that do
not (``count``, injected hyperparameters). After the params change, each
leaf of the optimizer's fresh state for the new params is matched by key
path: a leaf inside a mirror is found by the param path it ends with, and
keeps its old value when that param kept its path, shape and dtype; every
other leaf keeps the old state's leaf at the same path. Nothing is matched
by position, and a leaf that cannot be matched is refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from .errors import ConfigError, TreeMismatchError
from .keydtype import dtype_name
from .leaf import Record, summarize
from .mismatch import Mismatch
from .paths import Path, keystr, parse_user_path, starts_with
from .spec import spec_of
from .surgery import Change, Surgery
from .walk import NNX_STATE, qualname

_SOURCE = "optimizer state"


def _split(path: Path, params: dict[str, Record]) -> tuple[str, str] | None:
    """``(mirror prefix, param path)`` for a state leaf inside a tree that
    mirrors the params (the shortest prefix whose rest is a param's path)."""
    for j in range(len(path) + 1):
        rest = keystr(path[j:])
        if rest in params and (j < len(path) or len(params) == 1):
            return keystr(path[:j]), rest
    return None


def _leaves(tree: Any) -> tuple[list[Path], list[Any], list[Record]]:
    import jax  # this module is imported with the optimizer, which needs JAX anyway

    spec = spec_of(tree)
    return spec.paths, jax.tree.leaves(tree), spec.records


def _same(a: Record, b: Record) -> bool:
    return tuple(a[0]) == tuple(b[0]) and a[1] == b[1]


def migrate_opt_state(
    optimizer: Any,
    old_state: Any,
    old_params: Any,
    new_params: Any,
    /,
    *,
    reinit: Literal["changed"] | None = None,
    rename: Mapping[str, str] | None = None,
) -> tuple[Any, Surgery]:
    """Carries an optax state over to changed params, by key path.

    The optimizer's own ``init(new_params)`` gives the new state's structure.
    Each of its leaves that lies in a tree mirroring the params (a moment:
    adam's ``mu``/``nu``, momentum's trace) keeps the old state's value where
    the param kept its path, shape and dtype; a new param's leaves keep the
    optimizer's init; a removed param's leaves are dropped. Every other leaf
    (``count``, injected hyperparameters) keeps the old state's leaf at the
    same path. ``optax.chain``, ``multi_transform``, ``inject_hyperparams``
    and ``masked`` states are walked the same way.

    Args:
      optimizer: the optax ``GradientTransformation`` (anything with
        ``init``) the state belongs to, as configured for the new params;
        or an ``nnx.Optimizer`` built for the new model (its ``tx``).
      old_state: the state trained with ``old_params``, in either form: an
        optax state (``tx.init(params)`` after training), or an
        ``nnx.Optimizer``'s (``nnx.state(old_optimizer)``). The new state
        comes back in the same form: ``nnx.update(new_optimizer, state)``
        puts an nnx one in.
      old_params: the params ``old_state`` was built for.
      new_params: the changed params.
      reinit: ``"changed"``: a param whose shape or dtype changed gets the
        optimizer's init for its leaves (reported as reinitialised); by
        default such a change is refused.
      rename: ``{old path: new path}`` as given to ``load`` for the params
        (a leaf or a subtree): the moments of a renamed param follow it.

    Returns:
      ``(new_state, Surgery)``: the state, and each state leaf initialised,
      reinitialised or dropped, by path.

    Raises:
      TreeMismatchError: listing every state leaf that cannot be mapped by
        path (a leaf of one state with no counterpart in the other, a param
        whose shape changed) before anything is built.
      ConfigError: for an unknown ``reinit``, or an ``optimizer`` that is
        neither an optax transform nor an ``nnx.Optimizer``.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> old = {"w": jnp.ones(2)}
      >>> opt = optax.adam(0.1)
      >>> state = opt.update(old, opt.init(old), old)[1]
      >>> new = {"w": jnp.ones(2), "head": jnp.zeros(3)}
      >>> state2, report = migrate_opt_state(opt, state, old, new)
      >>> state2[0].mu["w"] is state[0].mu["w"], int(state2[0].count)
      (True, 1)
      >>> print(report)
      optimizer state: 2 changes
        initialised [0].mu['head'] f32[3]
        initialised [0].nu['head'] f32[3]
    """
    import jax  # this module is imported with the optimizer, which needs JAX anyway

    if reinit not in (None, "changed"):
        raise ConfigError(
            f"reinit must be None or 'changed', got {reinit!r}",
            hint='reinit="changed" gives a param whose shape changed a fresh state',
        )
    params = _Params.of(old_params, new_params, rename)
    fresh = _fresh_state(optimizer, old_state, new_params)
    m = _Migration(params, _leaves(old_state), reinit)
    f_paths, f_leaves, f_records = _leaves(fresh)
    for path, leaf, rec in zip(f_paths, f_leaves, f_records):
        m.place(path, leaf, rec)
    m.leftovers({s[0] for s in (_split(p, m.params.new) for p in f_paths) if s is not None})
    if m.found:
        raise TreeMismatchError(
            m.found,
            expected_from="the optimizer's state for the new params",
            actual_from="the old state",
            context=_SOURCE,
            hint=_form_hint(optimizer, old_state, m.found),
        )
    state = jax.tree.unflatten(jax.tree.structure(fresh), m.out)
    return state, Surgery.of(m.changes, _SOURCE)


@dataclasses.dataclass(frozen=True)
class _Params:
    """The old and new params by path, with ``rename`` applied.

    Attributes:
      orig: the old params' records by their old paths.
      moved_to: each old path's path after ``rename``.
      old: the old params' records by their paths after ``rename``.
      was: each old param's path before ``rename``, by its path after.
      new: the new params' records by path.
    """

    orig: dict[str, Record]
    moved_to: dict[str, str]
    old: dict[str, Record]
    was: dict[str, str]
    new: dict[str, Record]

    @classmethod
    def of(cls, old_params: Any, new_params: Any, rename: Mapping[str, str] | None) -> _Params:
        moves = [
            (parse_user_path(a, "rename"), parse_user_path(b, "rename"))
            for a, b in (rename or {}).items()
        ]

        def moved(path: Path) -> str:
            best = max(
                (m for m in moves if starts_with(path, m[0])),
                key=lambda m: len(m[0]),
                default=None,
            )
            return keystr(path if best is None else (*best[1], *path[len(best[0]) :]))

        old_spec, new_spec = spec_of(old_params), spec_of(new_params)
        orig = {keystr(p): r for p, r in zip(old_spec.paths, old_spec.records)}
        moved_to = {keystr(p): moved(p) for p in old_spec.paths}
        # a renamed param takes its new path over a param that was stored there
        order = sorted(orig, key=lambda n: moved_to[n] != n)
        return cls(
            orig=orig,
            moved_to=moved_to,
            old={moved_to[n]: orig[n] for n in order},
            was={moved_to[n]: n for n in order},
            new={keystr(p): r for p, r in zip(new_spec.paths, new_spec.records)},
        )


class _Migration:
    """The new state's leaves, changes and refusals, built one fresh leaf at
    a time from the old state's leaves indexed by mirror and path."""

    def __init__(
        self,
        params: _Params,
        old: tuple[list[Path], list[Any], list[Record]],
        reinit: Literal["changed"] | None,
    ) -> None:
        self.params, self.reinit = params, reinit
        self.o_paths, self.o_leaves, self.o_records = old
        self.mirror: dict[tuple[str, str], int] = {}
        self.plain: dict[str, int] = {}
        renamed: list[tuple[tuple[str, str], int]] = []
        for k, p in enumerate(self.o_paths):
            split = _split(p, params.orig)
            if split is None:
                self.plain[keystr(p)] = k
            elif params.moved_to[split[1]] == split[1]:
                self.mirror[split] = k
            else:
                renamed.append(((split[0], params.moved_to[split[1]]), k))
        self.mirror.update(renamed)
        self.prefixes = {q for q, _ in self.mirror}
        self.out: list[Any] = []
        self.changes: list[Change] = []
        self.found: list[Mismatch] = []
        self.used: set[int] = set()

    def _keep(self, src: int) -> None:
        self.used.add(src)
        self.out.append(self.o_leaves[src])

    def place(self, path: Path, leaf: Any, rec: Record) -> None:
        """The new state's leaf at ``path``: the old one it maps to, or the
        fresh one, or a refusal."""
        name = keystr(path)
        split = _split(path, self.params.new)
        if split is None:
            src = self.plain.get(name)
            if src is None:
                self.found.append(Mismatch(name, "missing", _shown(rec), None))
            elif not _same(self.o_records[src], rec):
                self.found.append(Mismatch(name, "shape", _shown(rec), _shown(self.o_records[src])))
            else:
                self._keep(src)
            return
        self._place_mirrored(name, split, leaf, rec)

    def _place_mirrored(self, name: str, split: tuple[str, str], leaf: Any, rec: Record) -> None:
        prefix, param = split
        src = self.mirror.get(split)
        if prefix not in self.prefixes:
            self.found.append(Mismatch(name, "missing", _shown(rec), None))
        elif param not in self.params.old:
            self.changes.append(_change("initialised", name, rec))
            self.out.append(leaf)
        elif src is None:  # a param there before, with no state then: another optimizer or filter
            self.found.append(Mismatch(name, "missing", _shown(rec), None))
        elif _same(self.params.old[param], self.params.new[param]) and _same(
            self.o_records[src], rec
        ):
            self._keep(src)
            if self.params.was[param] != param:
                source = keystr(self.o_paths[src])
                self.changes.append(_change("renamed", name, rec, source))
        elif self.reinit == "changed":
            self.used.add(src)
            self.changes.append(_change("reinitialised", name, rec))
            self.out.append(leaf)
        else:
            self.used.add(src)
            self.found.append(Mismatch(name, "shape", _shown(rec), _shown(self.o_records[src])))

    def leftovers(self, new_prefixes: set[str]) -> None:
        """The old leaves no new leaf took: dropped with their param, or refused."""
        for k, path in enumerate(self.o_paths):
            if k in self.used:
                continue
            split = _split(path, self.params.orig)
            if split is None or split[0] not in new_prefixes:
                self.found.append(
                    Mismatch(keystr(path), "unexpected", None, _shown(self.o_records[k]))
                )
            else:
                self.changes.append(_change("dropped", keystr(path), self.o_records[k]))


def _is_nnx_optimizer(optimizer: Any) -> bool:
    return type(optimizer).__module__.startswith("flax.nnx") and hasattr(optimizer, "tx")


def _nnx_form(state: Any) -> str | None:
    """The nnx form of ``state``: ``"optimizer"`` for an ``nnx.Optimizer``'s
    state (``nnx.state(optimizer)``, holding ``opt_state`` and ``step``),
    ``"opt_state"`` for its ``opt_state`` part alone (another nnx State), or
    None for an optax state (``tx.init(params)``)."""
    if qualname(type(state)) != NNX_STATE:
        return None
    return "optimizer" if "opt_state" in state else "opt_state"


def _fresh_state(optimizer: Any, old_state: Any, new_params: Any) -> Any:
    """The optimizer's state for the new params, in the form of ``old_state``:
    an ``nnx.Optimizer``'s state (or its ``opt_state`` part) for an nnx one
    (the nnx.Optimizer's own, or the one an nnx.Optimizer of this optax
    transform holds), or an optax state (``init(new_params)`` of the
    transform, or of the nnx.Optimizer's ``tx``).

    Raises:
      ConfigError: for an optimizer that is neither kind.
    """
    nnx_opt = _is_nnx_optimizer(optimizer)
    tx = optimizer.tx if nnx_opt else optimizer
    if not callable(getattr(tx, "init", None)):
        raise ConfigError(
            f"optimizer: an optax GradientTransformation or an nnx.Optimizer, got "
            f"{type(optimizer).__name__}",
            hint="pass the optax transform the state was made with, or an nnx.Optimizer built "
            "for the new model",
        )
    form = _nnx_form(old_state)
    if form is None:
        return tx.init(new_params)
    from flax import nnx  # flax is optional: only nnx states bring it here

    whole = nnx.state(optimizer) if nnx_opt else _nnx_optimizer_state(tx, new_params)
    return whole if form == "optimizer" else whole["opt_state"]


def _nnx_optimizer_state(tx: Any, params: Any) -> Any:
    """The state an ``nnx.Optimizer(model, tx, wrt=...)`` holds when
    ``params`` is ``nnx.state(model, wrt)``: its ``opt_state`` (optax's
    state of the params, each array an ``OptArray`` or ``OptVariable``) and
    its ``step``, laid out as ``nnx.state(optimizer)`` lays them out."""
    import jax.numpy as jnp  # this module is imported with the optimizer, which needs JAX anyway
    from flax import nnx  # flax is optional: only nnx states bring it here

    inner = nnx.state(nnx.optimizer.to_opt_state(tx.init(params)))  # type: ignore[no-untyped-call]
    return nnx.State(
        {"opt_state": inner.raw_mapping, "step": nnx.OptState(jnp.array(0, jnp.uint32))}
    )


def _form_hint(optimizer: Any, old_state: Any, found: list[Mismatch]) -> str:
    """The fix the refusal ends with: for changed shapes alone, ``reinit``;
    otherwise the form of ``old_state`` and what the new state was built from."""
    if all(m.kind == "shape" for m in found):
        return (
            "each state leaf is matched by key path; a moment follows its param, anything "
            "else must keep its path. Pass the optimizer the old state was made with, or "
            'reinit="changed" for a param whose shape changed'
        )
    given = "an nnx.Optimizer" if _is_nnx_optimizer(optimizer) else "this optax transform"
    nnx_form = _nnx_form(old_state)
    if nnx_form is not None:
        what = (
            "an nnx.Optimizer's state (nnx.state(optimizer))"
            if nnx_form == "optimizer"
            else "an nnx.Optimizer's opt_state (nnx.state(optimizer)['opt_state'])"
        )
        form = (
            f"old_state is {what}; the new one was "
            f"built in that form from {given}. Pass old_params and new_params as the "
            "optimizer's wrt filter gives them (nnx.state(model, nnx.Param)), and the "
            "transform the old state was made with"
        )
    else:
        form = (
            "old_state is an optax state (tx.init(params)); the new one was built in that form "
            f"from {given}'s init(new_params). Pass the params as the old state was made for "
            "them, and the transform the old state was made with"
        )
    return (
        f"{form}. Each state leaf is matched by key path; a moment follows its param, "
        'anything else keeps its path; reinit="changed" gives a param whose shape changed a '
        "fresh state"
    )


def _shown(rec: Record) -> str:
    return summarize(rec[0], rec[1])


def _change(action: Any, path: str, rec: Record, source: str | None = None) -> Change:
    return Change(action, path, tuple(int(d) for d in rec[0]), dtype_name(rec[1]), source)
