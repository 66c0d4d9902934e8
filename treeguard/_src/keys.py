"""PRNG key streams: which key was consumed where, and which was consumed twice.

JAX's own key-reuse checker (``jax.debug_key_reuse``) follows typed keys
through a program. It cannot follow a legacy ``jax.random.PRNGKey``: such a
key is a plain ``uint32[2]`` array, and every ``jax.random`` call wraps it
into a fresh typed key, so the same legacy key used twice looks like two new
keys. ``trace_keys`` closes that gap by identifying a key by its *content*
(implementation and key data) rather than by its variable. It traces the
function to a jaxpr, evaluates the jaxpr equation by equation on the real
inputs, and records every key that a random draw or a split consumes. A key
whose content is consumed twice is reused, whether it was typed or legacy,
passed in, split off or folded in; each key's origin (where it was split
off, from what) is kept for the report.

``fold_in`` does not consume its key (as in JAX's checker): folding in two
different messages gives two keys; folding in the same message twice gives
two equal keys, and their second use is reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import numpy as np

from .equation import CALLS, bind, site
from .paths import keystr
from .walk import flatten, structure_of

_LOOPS = frozenset(("while", "scan", "shard_map", "xla_pmap", "pmap"))


@dataclasses.dataclass(frozen=True)
class KeyReuse:
    """One key consumed a second time.

    Attributes:
      origin: where the key came from, e.g. ``"split[1] of the key passed
        to init (split at mlp.py:29 (init))"``.
      first: the first consumption: the operation and its source line.
      again: the second consumption.
      legacy: True when the key reached the draws as a raw ``uint32`` array
        (``jax.random.PRNGKey``), which JAX's checker does not follow.
    """

    origin: str
    first: str
    again: str
    legacy: bool

    def describe(self) -> str:
        """One line: the key, where it came from, and both uses.

        Example:
          >>> print(KeyReuse("the key passed to init", "random_bits at a.py:3 (f)",
          ...                "random_bits at a.py:4 (f)", True).describe())
          legacy uint32 key the key passed to init consumed twice:
          first by random_bits at a.py:3 (f), again by random_bits at a.py:4 (f)
        """
        kind = "legacy uint32 key" if self.legacy else "key"
        return f"{kind} {self.origin} consumed twice: first by {self.first}, again by {self.again}"


@dataclasses.dataclass(frozen=True)
class KeyTrace:
    """What ``trace_keys`` saw.

    Attributes:
      outputs: the function's outputs, computed on the way.
      consumed: how many key consumptions (draws and splits) were seen.
      reuses: every key consumed more than once, in the order found.
      unfollowed: higher-order operations (loops, maps) whose bodies draw or
        split keys but were evaluated whole, so their key use is left to
        JAX's checker.
    """

    outputs: Any
    consumed: int
    reuses: tuple[KeyReuse, ...]
    unfollowed: tuple[str, ...]


def _site_of(eqn: Any, fallback: str) -> str:
    where = site(eqn)[0]
    return fallback if where == "unknown" or where.startswith("<") else where


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)


class _Tracker:
    def __init__(self) -> None:
        self.origin: dict[tuple[str, bytes], str] = {}
        self.first_use: dict[tuple[str, bytes], str] = {}
        self.legacy: set[tuple[str, bytes]] = set()
        self.reported: set[tuple[str, bytes]] = set()
        self.reuses: list[KeyReuse] = []
        self.unfollowed: list[str] = []
        self.consumed = 0

    # -- key identities ---------------------------------------------------

    @staticmethod
    def idents(keys: Any) -> list[tuple[str, bytes]]:
        impl = str(jax.random.key_impl(keys))
        data = np.asarray(jax.random.key_data(keys))
        flat = data.reshape(-1, data.shape[-1]) if data.ndim else data.reshape(1, -1)
        return [(impl, row.tobytes()) for row in flat]

    def name(self, ident: tuple[str, bytes], text: str) -> None:
        self.origin.setdefault(ident, text)

    def describe(self, ident: tuple[str, bytes]) -> str:
        return self.origin.get(ident, f"of unknown origin (data {ident[1].hex()[:16]})")

    def consume(self, keys: Any, what: str) -> None:
        for ident in self.idents(keys):
            self.consumed += 1
            first = self.first_use.get(ident)
            if first is None:
                self.first_use[ident] = what
            elif ident not in self.reported:
                self.reported.add(ident)
                self.reuses.append(
                    KeyReuse(self.describe(ident), first, what, ident in self.legacy)
                )

    # -- evaluation -------------------------------------------------------

    def run(
        self,
        jaxpr: Any,
        consts: Sequence[Any],
        args: Sequence[Any],
        site: str,
        want: Sequence[bool] | None = None,
    ) -> list[Any]:
        """Evaluates ``jaxpr``; with ``want`` (one flag per output), only the
        equations that key use or a wanted output depends on (the rest give None)."""
        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jex.Literal) else env.get(v)

        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        keep = _needed(jaxpr, want) if want is not None else None
        for i, eqn in enumerate(jaxpr.eqns):
            if keep is not None and keep[i] is None:
                continue
            here = _site_of(eqn, site)
            invals = [read(v) for v in eqn.invars]
            outs = self.eqn(eqn, invals, here, None if keep is None else keep[i])
            for v, x in zip(eqn.outvars, outs):
                if not isinstance(v, jex.DropVar):
                    env[v] = x
        return [read(v) for v in jaxpr.outvars]

    def eqn(
        self, eqn: Any, invals: list[Any], site: str, want: list[bool] | None = None
    ) -> list[Any]:
        """One equation; ``want`` (sliced evaluation) flags the outputs needed."""
        name = eqn.primitive.name
        sub = CALLS.get(name)
        if sub is not None and sub in eqn.params:
            closed = eqn.params[sub]
            inner = getattr(closed, "jaxpr", closed)
            consts = getattr(closed, "consts", ())
            n_in = len(inner.invars)
            return self.run(inner, consts, invals[len(invals) - n_in :], site, want)
        if name == "cond" and "branches" in eqn.params:
            index = int(np.asarray(invals[0]))
            branches = eqn.params["branches"]
            branch = branches[max(0, min(index, len(branches) - 1))]
            return self.run(branch.jaxpr, branch.consts, invals[1:], site, want)
        if want is not None and not any(want):
            # Sliced: nothing downstream reads the outputs, so only the key
            # consumption (of an input already evaluated) is recorded.
            if name == "random_bits":
                self.consume(invals[0], f"a random draw at {site}")
            elif name == "random_split":
                self.consume(invals[0], f"a split at {site}")
            elif name in _LOOPS:
                self.unfollowed.append(f"{name} at {site}")
            return [None] * len(eqn.outvars)
        outs = bind(eqn, invals)
        if name == "random_bits":
            self.consume(invals[0], f"a random draw at {site}")
        elif name == "random_split":
            self.consume(invals[0], f"a split at {site}")
            parents = self.idents(invals[0])
            children = self.idents(outs[0])
            per = len(children) // max(1, len(parents))
            for p, parent in enumerate(parents):
                for i in range(per):
                    child = children[p * per + i]
                    self.name(child, f"split[{i}] of {self.describe(parent)} (split at {site})")
                    if parent in self.legacy:
                        self.legacy.add(child)
        elif name == "random_fold_in":
            for parent, child in zip(self.idents(invals[0]), self.idents(outs[0])):
                self.name(child, f"fold_in of {self.describe(parent)} (at {site})")
        elif name == "random_seed":
            for ident in self.idents(outs[0]):
                self.name(ident, f"created from a seed at {site}")
        elif name == "random_wrap":
            for ident in self.idents(outs[0]):
                self.legacy.add(ident)
                self.name(ident, f"from raw key data wrapped at {site}")
        elif name in _LOOPS and _draws_keys(eqn):
            self.unfollowed.append(f"{name} at {site}")
        return outs


def _draws_keys(eqn: Any) -> bool:
    text = str(eqn)
    return "random_bits" in text or "random_split" in text


_CONSUMERS = frozenset(("random_bits", "random_split"))


def _needed(jaxpr: Any, want: Sequence[bool]) -> list[list[bool] | None]:
    """For each equation, which of its outputs the key tracking needs (None:
    skip the equation): a backward slice from every key consumption and every
    wanted output. Calls, conds and loops that draw or split keys count as
    consumptions, and their operands are needed whole."""
    needed = {v for v, w in zip(jaxpr.outvars, want) if w and not isinstance(v, jex.Literal)}
    out: list[list[bool] | None] = [None] * len(jaxpr.eqns)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        flags = [v in needed for v in eqn.outvars]
        consumes = eqn.primitive.name in _CONSUMERS or (
            eqn.primitive.name not in ("random_fold_in", "random_seed", "random_wrap")
            and (bool(eqn.params) and _draws_keys(eqn))
        )
        if not (any(flags) or consumes):
            continue
        out[i] = flags
        if any(flags) or eqn.primitive.name != "random_bits":
            needed.update(v for v in eqn.invars if not isinstance(v, jex.Literal))
        else:
            needed.add(eqn.invars[0])
    return out


def trace_keys(
    fn: Callable[..., Any], /, *args: Any, names: Sequence[str] = (), outputs: bool = True
) -> KeyTrace:
    """Runs ``fn(*args)`` while tracking every PRNG key it consumes.

    The keys passed in (typed keys, or legacy ``uint32[2]`` keys from
    ``jax.random.PRNGKey``) are named after the arguments, and every key
    split or folded from them is named after its parent, so a reuse reports
    where the key came from.

    Args:
      fn: a function JAX can trace (``jax.make_jaxpr``); it is evaluated on
        the real arguments, equation by equation.
      *args: its arguments.
      names: how the report names each argument (``"the key passed to
        init"``); by default ``"argument 0"``, ...
      outputs: compute ``fn``'s outputs on the way. With False only the
        equations that keys flow through are evaluated (a backward slice
        from each draw and split), which skips compiling the rest op by op;
        ``KeyTrace.outputs`` is then None.

    Returns:
      A ``KeyTrace`` with the outputs and every reuse found.

    Raises:
      InvalidTreeError: if an argument is a cyclic tree (refused before
        anything else walks it).
      Exception: whatever ``fn`` raises while being traced or evaluated.

    Example:
      >>> def init(key):
      ...     a = jax.random.normal(key, (2,))
      ...     b = jax.random.normal(key, (2,))  # the same legacy key again
      ...     return a, b
      >>> trace = trace_keys(init, jax.random.PRNGKey(0), names=["the init key"])
      >>> print(trace.reuses[0].describe())  # doctest: +ELLIPSIS
      legacy uint32 key the init key consumed twice: first by a random draw at ...,
      again by a random draw at ...
    """
    tracker = _Tracker()
    for i, arg in enumerate(args):
        label = names[i] if i < len(names) else f"argument {i}"
        leaves, treedef = flatten(arg)  # refuses a cyclic tree, with its path, first
        for path, leaf in zip(structure_of(arg, treedef).leaf_paths(), leaves):
            where = label + keystr(path)
            if _is_key(leaf):
                for j, ident in enumerate(tracker.idents(leaf)):
                    tracker.name(ident, where if np.ndim(leaf) == 0 else f"{where}[{j}]")
            elif _is_legacy_data(leaf):
                typed = jax.random.wrap_key_data(jax.numpy.asarray(leaf))
                for ident in tracker.idents(typed):
                    tracker.name(ident, where)
                    tracker.legacy.add(ident)
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    flat_args = jax.tree.leaves(args)
    want = None if outputs else [False] * len(closed.jaxpr.outvars)
    site = getattr(fn, "__name__", "fn")
    outs = tracker.run(closed.jaxpr, closed.consts, flat_args, site, want)
    out_tree = jax.tree.structure(shapes)
    return KeyTrace(
        outputs=jax.tree.unflatten(out_tree, outs) if outputs else None,
        consumed=tracker.consumed,
        reuses=tuple(tracker.reuses),
        unfollowed=tuple(tracker.unfollowed),
    )


def _is_legacy_data(x: Any) -> bool:
    return (
        hasattr(x, "dtype")
        and np.dtype(x.dtype) == np.uint32
        and getattr(x, "ndim", 0) >= 1
        and x.shape[-1] == 2
    )
