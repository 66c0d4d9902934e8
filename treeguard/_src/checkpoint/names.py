"""Naming rules: how a key path of a tree names a tensor in a file, and back.

* ``"keypath"``: ``['encoder']['layer'][0]['weight']`` (treeguard's own names);
* ``"dotted"``: ``encoder.layer.0.weight`` (PyTorch, Hugging Face, MLX);
* ``"slashed"``: ``encoder/layer/0/weight`` (TensorFlow, some flax exports);
* ``"flat"``: one dict keyed by the whole name;
* a callable that takes the leaf's keys as a tuple of str and int and
  returns the name (it cannot be inverted, so it needs a ``like``).

Nesting by name goes the other way (``nest``): ``"dotted"`` splits
``a.b.0.c`` into ``{'a': {'b': {'0': {'c': ...}}}}``. Numeric components stay
string dict keys: a name cannot tell a list from a dict keyed by numbers,
and a like-tree or spec says which.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from ..errors import FormatError
from ..paths import Entry, Path, keystr, parse
from ..walk import MAX_DEPTH

NamingRule: TypeAlias = (
    Literal["keypath", "dotted", "slashed", "flat"] | Callable[[tuple[Any, ...]], str]
)


def namer(names: NamingRule) -> Callable[[Path], str]:
    """The function from a key path (as entries) to a tensor name.

    Raises:
      ValueError: for a rule that is none of the known ones.
    """
    if callable(names):
        rule = names

        def custom(path: Path) -> str:
            out = rule(tuple(k for _, k in path))
            if not isinstance(out, str):
                raise TypeError(
                    f"names: the naming function gave {type(out).__name__} for "
                    f"{keystr(path) or '<root>'}, not a str"
                )
            return out

        return custom
    if names == "keypath":
        return keystr
    if names == "dotted":
        return lambda path: ".".join(str(k) for _, k in path)
    if names == "slashed":
        return lambda path: "/".join(str(k) for _, k in path)
    if names == "flat":
        return lambda path: str(path[0][1]) if len(path) == 1 else keystr(path)
    raise ValueError(
        f"names must be 'keypath', 'dotted', 'slashed', 'flat' or a function of the keys, "
        f"got {names!r}"
    )


def index_once(names: Sequence[str], clash: Callable[[int, int], str]) -> dict[str, int]:
    """Each name's position; a name given twice is a ``ValueError`` whose
    message is ``clash(first position, second position)``.

    Example:
      >>> index_once(["a", "b"], lambda i, j: f"{i} and {j}")
      {'a': 0, 'b': 1}
      >>> index_once(["a", "a"], lambda i, j: f"{i} and {j} clash")
      Traceback (most recent call last):
      ...
      ValueError: 0 and 1 clash
    """
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            raise ValueError(clash(first[name], i))
        first[name] = i
    return first


def rule_label(names: NamingRule) -> str:
    return "a naming function" if callable(names) else f"names={names!r}"


def _split(tensor: str, names: NamingRule, where: str) -> list[Entry]:
    """A tensor name's entries under a naming rule; ``('index', i)`` only from keypaths."""
    if names == "flat":
        return [("key", tensor)]
    if names == "keypath":
        try:
            path = parse(tensor)
        except ValueError:
            path = ()
        if not path or keystr(path) != tensor:
            raise FormatError(
                f"tensor {tensor[:200]!r} is not a key path such as \"['dense1']['w']\"",
                context=where,
                hint="pick the rule the file was written with: names='dotted', 'slashed' or 'flat'",
            )
        return list(path)
    if callable(names):
        raise ValueError(
            "a naming function cannot be inverted to nest a tree; pass `like` (a tree or "
            "spec) to load by name, or pick names='dotted', 'slashed' or 'flat'"
        )
    sep = "." if names == "dotted" else "/"
    parts = tensor.split(sep)
    if any(p == "" for p in parts):
        raise FormatError(
            f"tensor {tensor[:200]!r} has an empty component under names={names!r}",
            context=where,
            hint="import it with names='flat' (one dict keyed by tensor name)",
        )
    return [("key", p) for p in parts]


def nest(values: Mapping[str, Any], names: NamingRule, where: str) -> Any:
    """Builds a nested tree from ``{tensor name: value}`` under a naming rule.

    Dotted and slashed components become string dict keys; keypath names
    keep their entries (``[0]`` a list index, ``['w']`` a dict key, ``.w`` an
    attribute, which becomes a dict key). Sorted by key, so the result does
    not depend on the file's order.

    Raises:
      FormatError: for a name that is both a leaf and a container, an empty
        component, nesting deeper than ``walk.MAX_DEPTH``, or list indices
        that are not ``0..n-1``.
    """
    root: dict[Any, Any] = {}
    for tensor in sorted(values):
        entries = _split(tensor, names, where)
        if len(entries) > MAX_DEPTH:
            raise FormatError(
                f"tensor {tensor[:200]!r} nests {len(entries)} levels deep, over {MAX_DEPTH}",
                context=where,
                hint="import it with names='flat' (one dict keyed by tensor name)",
            )
        node = root
        for i, entry in enumerate(entries):
            last = i == len(entries) - 1
            if last:
                if entry in node:
                    raise _clash(tensor, entries[: i + 1], where)
                node[entry] = values[tensor]
            else:
                child = node.setdefault(entry, {})
                if not isinstance(child, dict):
                    raise _clash(tensor, entries[: i + 1], where)
                node = child
    return _containers(root, (), where)


def _clash(tensor: str, prefix: list[Entry], where: str) -> FormatError:
    return FormatError(
        f"tensor {tensor[:200]!r}: {keystr(tuple(prefix))} is both a tensor and a group of tensors",
        context=where,
        hint="import it with names='flat' (one dict keyed by tensor name)",
    )


def _containers(node: dict[Any, Any], path: Path, where: str) -> Any:
    """Entry-keyed dicts to dicts and lists, without recursion depth beyond MAX_DEPTH."""
    kinds = {k for k, _ in node}
    if kinds == {"index"}:
        idx = sorted(key for _, key in node)
        if idx != list(range(len(idx))):
            raise FormatError(
                f"{keystr(path) or '<root>'}: list indices {idx[:5]}... are not 0..{len(idx) - 1}",
                context=where,
                hint="import it with names='flat' (one dict keyed by tensor name)",
            )
        return [
            _containers(node[("index", i)], (*path, ("index", i)), where)
            if isinstance(node[("index", i)], dict)
            else node[("index", i)]
            for i in idx
        ]
    if "index" in kinds:
        raise FormatError(
            f"{keystr(path) or '<root>'}: holds both list indices and keys",
            context=where,
            hint="import it with names='flat' (one dict keyed by tensor name)",
        )
    out: dict[Any, Any] = {}
    for (kind, key), child in sorted(node.items(), key=lambda kv: (str(kv[0][1]), kv[0][0])):
        if key in out:
            raise FormatError(
                f"{keystr((*path, (kind, key)))}: two entries give the key {key!r}",
                context=where,
                hint="import it with names='flat' (one dict keyed by tensor name)",
            )
        at: Path = (*path, ("key", key))
        out[key] = _containers(child, at, where) if isinstance(child, dict) else child
    return out


def style_of(tensors: Collection[str]) -> str | None:
    """The naming rule most of a file's names look written with, if any."""
    sample = list(tensors)[:200]
    if not sample:
        return None
    votes = {
        "keypath": sum(t.startswith("[") or t.startswith(".") for t in sample),
        "slashed": sum("/" in t for t in sample),
        "dotted": sum("." in t and not t.startswith(("[", ".")) for t in sample),
    }
    best = max(votes, key=lambda k: votes[k])
    return best if votes[best] * 2 >= len(sample) else None
