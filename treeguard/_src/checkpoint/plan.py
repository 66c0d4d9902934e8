"""Planning a load before any byte is read, for every stored format (a
single file's tensors, a sharded manifest's arrays): the part selected
(``subtree=``, ``ignore=``, stored paths named in ``unexpected=``), the
contract or the deliberate migration (``rename=``, ``allow_missing=``,
``missing="init"``, ``unexpected="drop"``), the values of new leaves from
``init=``, and the ``Surgery`` report of what changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..diff import mismatches
from ..errors import ConfigError, InvalidTreeError, TreeMismatchError
from ..keydtype import dtype_name
from ..leaf import summarize
from ..mismatch import Mismatch
from ..paths import keystr, parse, starts_with
from ..spec import TreeSpec, spec_of
from ..surgery import Change, Surgery
from ..walk import NNX_STATE, flatten, structure_of
from .migrate import migrate
from .select import Selection, container_hint, in_like_containers, select


@dataclasses.dataclass(frozen=True)
class SurgeryOptions:
    """What a load may change on purpose (see ``load``): initialise leaves of
    ``like`` the file lacks (``missing="init"`` from ``init``), and leave
    stored leaves unused (``unexpected="drop"``, or only under named paths)."""

    missing: str = "error"
    init: Any = None
    unexpected: Any = "error"

    @property
    def active(self) -> bool:
        return self.missing != "error" or self.unexpected != "error"

    @property
    def named(self) -> list[str]:
        """The stored paths ``unexpected=`` names (left unread, reported dropped)."""
        return [] if isinstance(self.unexpected, str) else list(self.unexpected)

    def check(self, like: Any) -> None:
        """Refuses options that cannot work, before the file is opened.

        Raises:
          ConfigError: naming the option and what it needs.
        """
        if self.missing not in ("error", "init"):
            raise ConfigError(
                f"missing must be 'error' or 'init', got {self.missing!r}",
                hint='missing="init" with init= gives new leaves their values',
            )
        if self.missing == "init" and self.init is None:
            raise ConfigError(
                'missing="init" needs init=: the values of the leaves the checkpoint lacks',
                hint="pass init=new_params (a tree like `like`) or a function of the key path",
            )
        if self.missing != "init" and self.init is not None:
            raise ConfigError(
                'init= is used only with missing="init"',
                hint='pass missing="init" to initialise the leaves the checkpoint lacks',
            )
        u = self.unexpected
        if not (u in ("error", "drop") if isinstance(u, str) else _all_text(u)):
            raise ConfigError(
                f"unexpected must be 'error', 'drop' or a list of key paths, got {u!r:.80}",
                hint='unexpected="drop" leaves every stored leaf `like` lacks unused',
            )
        if self.active and like is None:
            raise ConfigError(
                "missing= and unexpected= need `like`, the tree to load into",
                hint="pass like=new_params",
            )


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """What a load asks of the stored tree beyond reading it whole into the
    plain contract (see ``load``): the part to read (``subtree``,
    ``ignore``), the migration (``rename``, ``allow_missing``) and the
    surgery; the defaults ask for nothing."""

    rename: Mapping[str, str] = dataclasses.field(default_factory=dict)
    allow_missing: Sequence[str] = ()
    subtree: str | None = None
    ignore: Collection[str] = ()
    surgery: SurgeryOptions = SurgeryOptions()


def _all_text(x: Any) -> bool:
    return isinstance(x, (list, tuple, set, frozenset)) and all(isinstance(t, str) for t in x)


def select_part(stored: TreeSpec, options: LoadOptions, *, where: str) -> Selection:
    """The part of ``stored`` that ``subtree=``, ``ignore=`` and the paths
    named in ``unexpected=`` leave to read.

    Raises:
      ConfigError: for a path that names nothing stored.
    """
    subtree, ignore, named = options.subtree, options.ignore, options.surgery.named
    if subtree is None and not ignore and not named:
        return Selection(stored, list(range(stored.num_leaves)))
    left_out = ignore if isinstance(ignore, str) else [*ignore, *named]  # str: refused
    sel = select(stored, subtree=subtree, ignore=left_out, where=where)
    cut = [parse(t) for t in named]
    gone = tuple(
        Change("dropped", keystr(p), _ints(r[0]), dtype_name(r[1]))
        for p, r in zip(stored.paths, stored.records)
        if any(starts_with(p, c) for c in cut)
    )
    return dataclasses.replace(sel, dropped=gone)


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """For each leaf of ``like``, the selected stored leaf it is read from
    (None: it keeps ``like``'s value or takes its ``init`` value), the
    ``init`` values by position in ``like``, and the report."""

    sources: list[int | None]
    values: dict[int, Any]
    surgery: Surgery


def plan_load(
    part: Selection,
    where: str,
    like_spec: TreeSpec,
    like_leaves: list[Any] | None,
    options: LoadOptions,
    *,
    ignored: frozenset[str] = frozenset(("weak_type",)),
) -> LoadPlan:
    """Checks the contract (or the migration the options ask for) and plans
    the load; raises before any read.

    Args:
      part: the selected stored part.
      where: the file or directory, for messages.
      like_spec: the spec of the tree to load into.
      like_leaves: its leaves (None for a ``TreeSpec``).
      options: the load's (``part`` is its selection).
      ignored: mismatch kinds the plain contract does not count (a file
        keeps no weak types; a sharded restore reshards).

    Raises:
      TreeMismatchError: for every difference the options do not cover, and
        every ``init`` leaf missing or of another shape or dtype.
    """
    rename, allow_missing, surgery = options.rename, options.allow_missing, options.surgery
    stored = in_like_containers(part.spec, like_spec, part.cut)
    if not rename and not allow_missing and not surgery.active:
        found = [m for m in mismatches(stored, like_spec) if m.kind not in ignored]
        if found:
            raise TreeMismatchError(
                found,
                expected_from="`like`",
                actual_from="the checkpoint",
                context=where,
                hint=container_hint(found),
            )
        sources: list[int | None] = list(range(stored.num_leaves))
    else:
        sources = migrate(
            stored,
            where,
            like_spec,
            like_leaves,
            rename,
            allow_missing,
            init_missing=surgery.missing == "init",
            drop=(lambda _p: True) if surgery.unexpected == "drop" else None,
        )
    like_names = [keystr(p) for p in like_spec.paths]
    kept = [any(starts_with(p, parse(a)) for a in allow_missing) for p in like_spec.paths]
    fresh = [i for i, k in enumerate(sources) if k is None and not kept[i]]
    values = _init_values(surgery.init, fresh, like_names, like_spec, where) if fresh else {}
    report = _report(stored, like_spec, sources, fresh, where)
    if part.dropped:
        report = Surgery.of([*report.changes, *part.dropped], report.source)
    return LoadPlan(sources, values, report)


def _init_values(
    init: Any, fresh: Sequence[int], like_names: Sequence[str], like_spec: TreeSpec, where: str
) -> dict[int, Any]:
    """The value of each leaf to initialise, from ``init`` (a tree, matched by
    key path, or a function of the key path), checked against ``like``.

    Raises:
      TreeMismatchError: listing every leaf ``init`` lacks or gives another
        shape or dtype.
      ConfigError: for an ``init`` that is neither a tree nor a function.
    """
    if init_is_function(init):
        given = {i: init(like_names[i]) for i in fresh}
        origin = "`init(path)`"
    else:
        leaves, _ = flatten(init)
        paths = structure_of(init).leaf_paths()
        by_path = dict(zip((keystr(p) for p in paths), leaves))
        given = {i: by_path[like_names[i]] for i in fresh if like_names[i] in by_path}
        origin = "`init`"
    found: list[Mismatch] = []
    records = like_spec.records
    for i in fresh:
        shape, dtype = records[i][0], records[i][1]
        want = summarize(shape, dtype)
        if i not in given:
            found.append(Mismatch(like_names[i], "missing", want, None))
            continue
        try:
            got = spec_of(given[i]).records[0]
        except (TypeError, InvalidTreeError):
            found.append(Mismatch(like_names[i], "node_type", "an array", type(given[i]).__name__))
            continue
        if tuple(got[0]) != tuple(shape):
            found.append(Mismatch(like_names[i], "shape", shape, got[0]))
        elif got[1] != dtype:
            found.append(Mismatch(like_names[i], "dtype", dtype, got[1]))
    if found:
        raise TreeMismatchError(
            found,
            expected_from="`like`",
            actual_from=origin,
            context=where,
            hint="init gives each leaf the checkpoint lacks its value, of `like`'s shape "
            "and dtype, at `like`'s key path: pass the new model's params in `like`'s form"
            + (
                " (nnx.state(new_model), not the module)"
                if like_spec.structure.type_name == NNX_STATE
                else ""
            ),
        )
    return given


def init_is_function(init: Any) -> bool:
    """Whether ``init=`` is the function form (called with each new leaf's key
    path) rather than a tree of values: told apart by what it is, never by
    ``callable`` (an equinox module is callable and is a tree of arrays). A
    tree (any pytree node: a dict, an nnx State, an equinox module) or an
    array is values; a lone callable leaf (a function, a ``functools.partial``)
    is a function.

    Raises:
      ConfigError: for anything else (a string, a number).

    Example:
      >>> import numpy as np
      >>> init_is_function({"w": np.ones(2)}), init_is_function(lambda path: np.ones(2))
      (False, True)
    """
    import jax  # a reader of headers alone never imports JAX

    if hasattr(init, "shape") or not jax.tree_util.treedef_is_leaf(jax.tree.structure(init)):
        return False
    if callable(init):
        return True
    raise ConfigError(
        f"init: a tree of arrays (the new model's params) or a function of a key path, "
        f"got {type(init).__name__}",
        hint="pass init=new_params, or init=lambda path: array",
    )


def _report(
    stored: TreeSpec,
    like_spec: TreeSpec,
    sources: Sequence[int | None],
    fresh: Sequence[int],
    where: str,
) -> Surgery:
    stored_names = [keystr(p) for p in stored.paths]
    like_names = [keystr(p) for p in like_spec.paths]
    changes: list[Change] = []
    for i in fresh:
        shape, dtype = like_spec.records[i][0], like_spec.records[i][1]
        changes.append(Change("initialised", like_names[i], _ints(shape), dtype_name(dtype)))
    used = set()
    for i, k in enumerate(sources):
        if k is None:
            continue
        used.add(k)
        if stored_names[k] != like_names[i]:
            shape, dtype = stored.records[k][0], stored.records[k][1]
            changes.append(
                Change("renamed", like_names[i], _ints(shape), dtype_name(dtype), stored_names[k])
            )
    for k, name in enumerate(stored_names):
        if k not in used:
            shape, dtype = stored.records[k][0], stored.records[k][1]
            changes.append(Change("dropped", name, _ints(shape), dtype_name(dtype)))
    return Surgery.of(changes, where)


def _ints(shape: Sequence[Any]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)
