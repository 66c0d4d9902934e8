"""TreeSpec and LeafSpec: the contract of a pytree.

Its JSON form is ``specjson.py``; what one leaf is (dtype, summary,
sharding text) is ``leaf.py``. Reading a spec from JSON and printing it needs
numpy only: JAX is imported by the functions that meet live arrays, and
``ml_dtypes`` only for a dtype numpy does not know by name (``bfloat16``, the
float8 types).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

from . import specjson
from .atomic import atomic_write
from .errors import FormatError, InvalidTreeError
from .keydtype import array_dtype
from .leaf import Record, Shape
from .leafspec import LeafSpec, leaf_signature, record_of, signature_in
from .paths import Path, keystr, short_repr
from .strictjson import loads as strict_loads
from .walk import (
    Node,
    flatten_with_types,
    invalid_leaves,
    structure_of,
)

__all__ = [
    "LeafSpec",
    "TreeSpec",
    "invalid_leaves_hint",
    "record_of",
    "spec_from_leaves",
    "spec_of",
]

_aval = attrgetter("aval")
_shape = attrgetter("shape")
_dtype = attrgetter("dtype")


class TreeSpec:
    """The contract of a pytree: its structure and every leaf's shape and dtype.

    Take one from a live tree with ``spec_of``, read one from JSON with
    ``TreeSpec.from_json`` or ``TreeSpec.load``. Two specs are equal when
    their JSON forms are; equal specs give byte-identical JSON.

    Example:
      >>> import jax.numpy as jnp
      >>> s = spec_of({"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
      >>> s
      TreeSpec({'b': f32[3], 'w': f32[2,3]})
      >>> TreeSpec.from_json(s.to_json()) == s
      True
    """

    __slots__ = (
        "_avals",
        "_canon",
        "_columns",
        "_has_sharding",
        "_leaves",
        "_paths",
        "_records",
        "_root",
        "_treedef",
        "_validated",
    )

    def __init__(
        self,
        root: Node,
        records: Sequence[Record] | None,
        *,
        avals: Sequence[Any] | None = None,
        columns: tuple[Sequence[Shape], Sequence[np.dtype[Any]]] | None = None,
        treedef: Any = None,
    ) -> None:
        self._root = root
        self._records: list[Record] | None = list(records) if records is not None else None
        self._avals = avals
        # numpy leaves' shapes and dtypes (never weakly typed, no sharding),
        # turned into records only when they are read
        self._columns = columns
        self._treedef = treedef
        self._paths: list[Path] | None = None
        self._leaves: tuple[LeafSpec, ...] | None = None
        # treedef -> (top_levels of the trees validated with it, leaf signatures)
        self._validated: dict[Any, tuple[list[Any], list[Any]]] = {}
        self._canon: str | None = None
        self._has_sharding: bool | None = None
        if avals is not None:
            n = len(avals)
        elif columns is not None:
            n = len(columns[0])
        else:
            n = len(self._records or ())
        if n != root.num_leaves:
            raise FormatError(f"spec has {n} leaf records for {root.num_leaves} leaves")

    # -- reading -----------------------------------------------------------

    @property
    def structure(self) -> Node:
        """The root ``Node`` of the structure."""
        return self._root

    @property
    def records(self) -> list[Record]:
        """One ``(shape, dtype, weak_type, sharding)`` per leaf, in flatten order."""
        if self._records is None and self._columns is not None:
            shapes, dtypes = self._columns
            self._records = list(zip(shapes, dtypes, repeat(False), repeat(None)))
        if self._records is None:
            assert self._avals is not None
            self._records = [
                (tuple(a.shape), array_dtype(a.dtype), bool(a.weak_type), None) for a in self._avals
            ]
        return self._records

    @property
    def paths(self) -> list[Path]:
        """Every leaf's path as entries, in flatten order."""
        if self._paths is None:
            self._paths = self._root.leaf_paths()
        return self._paths

    @property
    def leaves(self) -> tuple[LeafSpec, ...]:
        """Every leaf's ``LeafSpec``, with its path, in flatten order."""
        if self._leaves is None:
            self._leaves = tuple(
                LeafSpec(s, d, w, sh, keystr(p))
                for (s, d, w, sh), p in zip(self.records, self.paths)
            )
        return self._leaves

    @property
    def num_leaves(self) -> int:
        return self._root.num_leaves

    @property
    def num_params(self) -> int | None:
        """Total element count, or None when some dimension is symbolic."""
        total = 0
        for shape, *_ in self.records:
            if any(isinstance(d, str) for d in shape):
                return None
            total += math.prod(int(d) for d in shape)
        return total

    @property
    def nbytes(self) -> int | None:
        """Total bytes of all leaves, or None when some dimension is symbolic."""
        total = 0
        for shape, dtype, *_ in self.records:
            if any(isinstance(d, str) for d in shape):
                return None
            total += math.prod(int(d) for d in shape) * dtype.itemsize
        return total

    @property
    def has_sharding(self) -> bool:
        """Whether any leaf records a sharding, so checks must read shardings."""
        if self._has_sharding is None:
            self._has_sharding = self._records is not None and any(
                r[3] is not None for r in self._records
            )
        return self._has_sharding

    @property
    def symbols(self) -> frozenset[str]:
        """The symbolic dimensions the spec uses."""
        return frozenset(d for s, *_ in self.records for d in s if isinstance(d, str))

    def __getitem__(self, path: str) -> LeafSpec:
        """The leaf at a ``keystr`` path.

        Raises:
          KeyError: with the closest paths when there is no such leaf.
        """
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        close = difflib.get_close_matches(path, [leaf.path for leaf in self.leaves], n=3)
        raise KeyError(
            f"no leaf at {path}" + (f"; did you mean {', '.join(close)}?" if close else "")
        )

    @property
    def treedef(self) -> Any:
        """A JAX treedef of this structure.

        A spec read from JSON rebuilds its treedef from plain containers;
        custom nodes and namedtuples cannot be rebuilt without their classes.

        Raises:
          InvalidTreeError: for a JSON spec holding a custom node or namedtuple.
        """
        if self._treedef is None:
            import jax  # lazy: reading files never imports jax

            self._treedef = jax.tree.structure(_skeleton(self._root, ()))
        return self._treedef

    def abstract(self, dims: Mapping[str, int] | None = None) -> Any:
        """The tree of ``jax.ShapeDtypeStruct`` this spec describes.

        Args:
          dims: a size for each symbolic dimension.

        Raises:
          ValueError: naming a symbol with no size.

        Example:
          >>> s = spec_of({"x": LeafSpec(("B", 2), "float32")})
          >>> s.abstract({"B": 4})["x"].shape
          (4, 2)
        """
        import jax  # lazy: reading files never imports jax

        dims = dict(dims or {})
        missing = self.symbols - dims.keys()
        if missing:
            raise ValueError(f"no size given for symbolic dimension(s) {sorted(missing)}")
        structs = [
            jax.ShapeDtypeStruct(  # type: ignore[no-untyped-call]
                tuple(dims[d] if isinstance(d, str) else d for d in s), d_, weak_type=bool(w)
            )
            for s, d_, w, _ in self.records
        ]
        return jax.tree.unflatten(self.treedef, structs)

    # -- identity ----------------------------------------------------------

    def _canonical(self) -> str:
        if self._canon is None:
            self._canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return self._canon

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TreeSpec):
            return NotImplemented
        return self is other or self._canonical() == other._canonical()

    def __hash__(self) -> int:
        return hash(self._canonical())

    def __repr__(self) -> str:
        parts = []
        for leaf in self.leaves[:6]:
            parts.append(f"{leaf.path or '<root>'}: {leaf.summary()}")
        more = f", ... {self.num_leaves - 6} more" if self.num_leaves > 6 else ""
        if self._root.kind == "dict" and all(len(p) == 1 for p in self.paths[:6]):
            inner = ", ".join(
                f"{short_repr(p[0][1])}: {leaf.summary()}"
                for p, leaf in zip(self.paths, self.leaves[:6])
            )
            return f"TreeSpec({{{inner}{more}}})"
        return f"TreeSpec({', '.join(parts)}{more})"

    # -- JSON --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (see the README for the schema).

        Raises:
          InvalidTreeError: naming a dict key that JSON cannot hold.
        """
        return specjson.encode(self._root, self.records)

    def to_json(self, *, indent: int | None = 1) -> str:
        """The spec as JSON text; equal specs give byte-identical text."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> TreeSpec:
        """Reads the form ``to_dict`` writes, strictly.

        Every field is type-checked. A node's children must be what its kind
        allows: indices ``0..n-1`` in order for lists and tuples, distinct
        hashable keys for dicts, distinct attribute names for namedtuples,
        none for ``none`` and leaves; and every key must read back from its
        text form, so the leaves' key paths are distinct. Nesting deeper than
        ``walk.MAX_DEPTH`` is refused.

        Raises:
          FormatError: for anything that is not a treeguard spec of a known
            version, naming where in the document it went wrong.
        """
        root, records = specjson.decode(data)
        return cls(root, records)

    @classmethod
    def from_json(cls, text: str | bytes) -> TreeSpec:
        """Reads a spec from JSON text, strictly (see ``from_dict``).

        Raises:
          FormatError: for malformed JSON, non-UTF-8 bytes, a key given twice,
            NaN or Infinity, an integer of more than 20 digits, or a bad document.
        """
        return cls.from_dict(strict_loads(text, "spec"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the JSON to ``path`` atomically.

        The text goes to a uniquely named temp file in the same directory,
        which is fsynced and renamed over ``path``; the directory is fsynced
        too. A crash leaves the old file or the new one, never a mix, and a
        failed write leaves no temp file behind.

        Args:
          path: the file to write.

        Raises:
          OSError: if the directory cannot be written.

        Example:
          >>> import tempfile, pathlib, jax.numpy as jnp
          >>> target = pathlib.Path(tempfile.mkdtemp()) / "params.spec.json"
          >>> spec_of({"w": jnp.ones(2)}).save(target)
          >>> TreeSpec.load(target).num_leaves
          1
        """
        atomic_write(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TreeSpec:
        """Reads a spec saved with ``save``.

        Raises:
          FormatError: if the file is not a treeguard spec.
          OSError: if it cannot be read.
        """
        with open(path, "rb") as f:
            data = f.read(64 * 1024 * 1024 + 1)
        if len(data) > 64 * 1024 * 1024:
            raise FormatError("larger than 64 MiB, not a spec", context=os.fspath(path))
        try:
            return cls.from_json(data)
        except FormatError as e:  # the same error, naming the file it came from
            raise FormatError(
                e.message, context=e.context or os.fspath(path), hint=e.hint, where=e.where
            ) from e

    # -- the validated-signature cache used by ``check`` --------------------

    def _accepts_at_once(self, tree: Any, top: tuple[Any, ...]) -> bool:
        """Whether ``tree`` has a structure and leaf signature this spec
        validated before, judged without walking or flattening it whole.

        ``flatten_up_to`` checks the structure against a validated treedef
        in one pass, building no new treedef to compare, and it needs no
        cycle guard: it never goes deeper than that treedef, which is a
        finite tree. What it returns as leaves must really be leaves
        (``leaf_signature`` is None for a subtree, a cycle, None or a string
        found where a leaf was). It is tried only when the tree's top looks
        like one validated with that treedef: on a mismatch, JAX puts the
        subtree's repr in its error, which the top's look keeps small.
        """
        for treedef, (tops, seen) in list(self._validated.items()):  # other threads may add
            if top not in tops:
                continue
            try:
                leaves = treedef.flatten_up_to(tree)
            except Exception:  # noqa: BLE001 - any other structure is a miss
                continue
            if signature_in(leaves, seen):
                return True
        return False

    def _accepts(self, leaves: list[Any], treedef: Any) -> bool:
        """Whether flattened leaves and treedef match ones validated before."""
        entry = self._validated.get(treedef)
        return entry is not None and signature_in(leaves, entry[1])

    def _remember(self, leaves: list[Any], treedef: Any, top: tuple[Any, ...]) -> None:
        sig = leaf_signature(leaves)
        if sig is None:
            return
        if len(self._validated) >= 8 and treedef not in self._validated:
            self._validated.pop(next(iter(self._validated)))
        tops, seen = self._validated.setdefault(treedef, ([], []))
        if top not in tops:
            if len(tops) >= 4:
                tops.pop(0)
            tops.append(top)
        if any(sig == s for s in seen):
            return
        if len(seen) >= 16:
            seen.pop(0)
        seen.append(sig)


_STATIC_HINT = "keep only arrays in a parameter tree; hold config in static fields"
_EQUINOX_HINT = (
    "an equinox module holds config beside its arrays (activations, sizes, "
    "non-array fields); take its arrays with `eqx.filter(model, eqx.is_array)` "
    "and check or save those, or mark config fields `eqx.field(static=True)`"
)


def _is_equinox(t: type) -> bool:
    """Whether ``t`` is an equinox ``Module``, read from its MRO's module
    names so equinox need not be imported."""
    return any(c.__module__.split(".", 1)[0] == "equinox" for c in getattr(t, "__mro__", ()))


def invalid_leaves_hint(tree: Any, types: Iterable[type] | None = None) -> str:
    """The fix for a tree with non-array leaves: filtering an equinox module
    to its arrays when the tree holds one, else keeping config static.

    Args:
      tree: the refused tree.
      types: the types ``assert_acyclic`` met in it, when known.

    Example:
      >>> invalid_leaves_hint({"w": "relu"})
      'keep only arrays in a parameter tree; hold config in static fields'
    """
    met = set(types) if types is not None else {type(tree)}
    return _EQUINOX_HINT if any(map(_is_equinox, met)) else _STATIC_HINT


def spec_of(
    tree: Any,
    *,
    dims: Mapping[str, int] | None = None,
    sharding: bool = False,
) -> TreeSpec:
    """Captures the contract of a live tree.

    Args:
      tree: a pytree whose leaves are arrays, numpy values, Python numbers,
        ``jax.ShapeDtypeStruct`` or ``LeafSpec`` (for hand-written specs).
      dims: symbolic axes, as ``{symbol: axis}``; every leaf's size on that
        axis is recorded as the symbol. ``{"B": 0}`` makes axis 0 the batch.
      sharding: also record each array's sharding.

    Returns:
      The ``TreeSpec``.

    Raises:
      InvalidTreeError: if the tree contains itself or holds leaves that are
        not arrays, naming each path and type (an unfiltered equinox module
        gets a hint to filter it with ``eqx.filter(model, eqx.is_array)``).
      ValueError: if a leaf has no axis for a symbol in ``dims``.

    Example:
      >>> import jax.numpy as jnp
      >>> s = spec_of({"x": jnp.zeros((8, 2))}, dims={"B": 0})
      >>> s.leaves[0].shape
      ('B', 2)
    """
    leaves, treedef, types = flatten_with_types(tree)
    return spec_from_leaves(tree, leaves, treedef, types, dims=dims, sharding=sharding)


def spec_from_leaves(
    tree: Any,
    leaves: list[Any],
    treedef: Any,
    types: frozenset[type] | None,
    *,
    dims: Mapping[str, int] | None = None,
    sharding: bool = False,
) -> TreeSpec:
    """``spec_of`` of a tree its caller has flattened already (``flatten_with_types``).

    Raises:
      InvalidTreeError: as ``spec_of``.
      ValueError: as ``spec_of``.
    """
    root = structure_of(tree, treedef, types)
    if not dims and not sharding:
        try:
            avals = list(map(_aval, leaves))
        except AttributeError:
            avals = None
        if avals is not None and all(hasattr(a, "shape") for a in avals):
            return TreeSpec(root, None, avals=avals, treedef=treedef)
    kinds = tuple(map(type, leaves))
    records: list[Record]
    if kinds.count(np.ndarray) == len(kinds) and not dims:
        columns = (tuple(map(_shape, leaves)), tuple(map(_dtype, leaves)))
        return TreeSpec(root, None, columns=columns, treedef=treedef)
    if kinds.count(np.ndarray) == len(kinds):
        # numpy arrays carry no weak type and no sharding
        records = list(zip(map(_shape, leaves), map(_dtype, leaves), repeat(False), repeat(None)))
    else:
        bad = invalid_leaves(leaves, root.leaf_paths, (LeafSpec,))
        if bad:
            raise InvalidTreeError(bad, hint=invalid_leaves_hint(tree, types))
        records = [record_of(x, sharding) for x in leaves]
    if dims:
        records = _apply_dims(records, dims, root)
    return TreeSpec(root, records, treedef=treedef)


def _apply_dims(records: list[Record], dims: Mapping[str, int], root: Node) -> list[Record]:
    out: list[Record] = []
    paths = root.leaf_paths()
    for (shape, dtype, weak, sh), path in zip(records, paths):
        new = list(shape)
        for sym, axis in dims.items():
            if not isinstance(sym, str) or not sym:
                raise ValueError(f"dims keys are symbol names, got {sym!r}")
            if not -len(shape) <= axis < len(shape):
                raise ValueError(
                    f"{keystr(path) or '<root>'}: shape {tuple(shape)} has no axis {axis} "
                    f"for symbol {sym!r}"
                )
            new[axis] = sym
        out.append((tuple(new), dtype, weak, sh))
    return out


def _skeleton(node: Node, path: Path) -> Any:
    """Plain containers of the node's shape, with ``0`` as every leaf."""
    if node.kind == "leaf":
        return 0
    if node.kind == "none":
        return None
    kids = [_skeleton(c, (*path, e)) for e, c in zip(node.entries, node.children)]
    if node.kind == "dict":
        return {e[1]: k for e, k in zip(node.entries, kids)}
    if node.kind == "list":
        return kids
    if node.kind == "tuple":
        return tuple(kids)
    raise InvalidTreeError(
        [(keystr(path), f"{node.kind} node {node.type_name} cannot be rebuilt from JSON")],
        hint="use spec_of on a live tree, or pass a `like` tree that has the class",
    )
