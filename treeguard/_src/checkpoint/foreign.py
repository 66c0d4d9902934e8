"""Weights another tool wrote: a plain safetensors file, matched to a tree by name.

A safetensors file that ``save`` did not write (Hugging Face, MLX, a
``safetensors.numpy.save_file`` call) has tensor names but no contract and
no hashes. Its header is read as strictly as a checkpoint's: every entry
holds exactly ``dtype``, ``shape`` and ``data_offsets``; the dtype is one of
the safetensors names (little-endian by definition); each size is checked
against its shape and dtype with Python integers (no overflow); the tensors
must cover the data section exactly, without gaps or overlaps, as the
safetensors reference reader requires. Nothing is allocated before all of
that has passed, and nothing is ever unpickled.

Tensors are matched to ``like``'s leaves by name under a naming rule
(``names.py``); every missing and unexpected name and every shape and dtype
difference is listed before any tensor is read.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np

from ..errors import (
    FormatError,
    IntegrityError,
    TreeMismatchError,
    UnverifiedWeightsWarning,
)
from ..leaf import summarize
from ..mismatch import Mismatch
from ..paths import Path, keystr, parse_user_path, starts_with
from ..spec import LeafSpec, TreeSpec
from .foreignheader import ForeignHeader, tensor_name
from .format import BAD_FILE_HINT
from .migrate import flat_mismatches
from .names import NamingRule, index_once, namer, nest, rule_label, style_of
from .restore import as_like, build_like, read_ranges, walk_like

Unverified: TypeAlias = Literal["refuse", "warn", "allow"]

_UNVERIFIED_HINT = (
    'pass unverified="allow" to load it knowing that no hash checks it '
    '(unverified="warn" to be warned each time), or turn it into a hashed checkpoint '
    "once with `treeguard import SRC DST` and load that"
)


# -- loading by name --------------------------------------------------------------


def _near_misses(
    missing: list[tuple[str, str]], unexpected: list[str], names: NamingRule
) -> str | None:
    """The hint: the rule the file's names seem written with, or near-miss names."""
    if missing and unexpected and not callable(names):
        style = style_of(unexpected)
        if style is not None and style != names and len(missing) * 2 >= len(unexpected):
            return f"the file's names look {style} ({unexpected[0][:80]!r}); pass names={style!r}"
    if unexpected and not missing:
        return (
            "the file holds tensors no leaf of `like` reads; every tensor must be accounted "
            "for, so add leaves for them to `like`"
        )
    tips = []
    for path, wanted in missing:
        close = difflib.get_close_matches(wanted, unexpected, n=1, cutoff=0.6)
        if close:
            tips.append(f"`{path}` is read from {wanted!r}: did you mean {close[0]!r}?")
    if tips:
        return (
            " ".join(tips[:3])
            + " (map a whole subtree with rename={\"['in_file']\": \"['in_like']\"})"
        )
    return None


@dataclasses.dataclass
class _Match:
    """``like``'s leaves matched to the file's tensors by name."""

    sources: list[str | None]
    like_spec: TreeSpec
    like_leaves: list[Any] | None
    like_treedef: Any


def match(
    header: ForeignHeader,
    like: Any,
    *,
    names: NamingRule,
    rename: Mapping[str, str],
    allow_missing: Collection[str],
) -> _Match:
    """Matches every leaf of ``like`` to a tensor by name, before any data is read.

    ``rename={old: new}`` reads the leaves under ``new`` in ``like`` from the
    tensors the rule names for ``old``; ``allow_missing`` lists paths of
    ``like`` that may have no tensor (their values are kept).

    Raises:
      TreeMismatchError: listing every missing and unexpected tensor and every
        shape and dtype difference, by key path.
      ValueError: for a rename or allow_missing path that names nothing of
        ``like``, or two leaves the rule gives one name.
    """
    namer(names)  # an unknown rule is refused before anything else
    like_spec, like_leaves, like_treedef = walk_like(like)
    renames = [
        (parse_user_path(o, "rename"), parse_user_path(n, "rename"), n) for o, n in rename.items()
    ]
    optional = [parse_user_path(a, "allow_missing") for a in allow_missing]
    paths = like_spec.paths
    for prefix, text in [(n, t) for _, n, t in renames] + list(zip(optional, allow_missing)):
        if not any(starts_with(p, prefix) for p in paths):
            raise ValueError(f"{text} names no leaf or subtree of `like`")
    by_name = {t.name: t for t in header.tensors}
    wanted = _tensor_names(paths, renames, names)
    found: list[Mismatch] = []
    missing: list[tuple[str, str]] = []
    sources: list[str | None] = []
    stored_flat: dict[str, LeafSpec] = {}
    like_flat: dict[str, LeafSpec] = {}
    for i, (p, w, rec) in enumerate(zip(paths, wanted, like_spec.records)):
        where = keystr(p)
        t = by_name.get(w)
        if t is not None:
            sources.append(w)
            stored_flat[where] = LeafSpec(t.shape, t.dtype)
            like_flat[where] = LeafSpec(rec[0], rec[1])
            continue
        sources.append(None)
        if any(starts_with(p, o) for o in optional):
            ref = like_leaves[i] if like_leaves is not None else None
            if ref is None or isinstance(ref, LeafSpec) or not hasattr(ref, "shape"):
                raise ValueError(
                    f"allow_missing: {where or '<root>'} has no tensor in {header.path} and "
                    "`like` holds no value to keep there; pass a `like` tree with arrays"
                )
            continue
        missing.append((where or "<root>", w))
        found.append(
            Mismatch(where, "missing", f"{summarize(rec[0], rec[1])} as tensor {w[:200]!r}", None)
        )
    used = {s for s in sources if s is not None}
    unexpected = [t.name for t in sorted(header.tensors, key=tensor_name) if t.name not in used]
    found += [Mismatch(repr(n[:200]), "unexpected", None, by_name[n].summary()) for n in unexpected]
    found += flat_mismatches(stored_flat, like_flat)
    if found:
        where = f"{header.path} (tensors named by {rule_label(names)})"
        hint = _near_misses(missing, unexpected, names)
        raise TreeMismatchError(
            found, expected_from="`like`", actual_from="the file", context=where, hint=hint
        )
    return _Match(sources, like_spec, like_leaves, like_treedef)


def _tensor_names(
    paths: Sequence[Path], renames: Sequence[tuple[Path, Path, str]], names: NamingRule
) -> list[str]:
    """The tensor each leaf of ``like`` (at ``paths``) reads: its path, or
    the stored path a rename (the longest matching) gives it, named by the rule.

    Raises:
      ValueError: for two leaves the rule gives one name.
    """
    to_name = namer(names)
    wanted: list[str] = []
    for p in paths:
        best = max(
            (r for r in renames if starts_with(p, r[1])), key=lambda r: len(r[1]), default=None
        )
        source = p if best is None else (*best[0], *p[len(best[1]) :])
        wanted.append(to_name(source))
    index_once(
        wanted,
        lambda i, j: (
            f"{keystr(paths[i]) or '<root>'} and {keystr(paths[j]) or '<root>'} both "
            f"read tensor {wanted[i][:200]!r} under {rule_label(names)}; pick another rule"
        ),
    )
    return wanted


def read_tensors(
    fd: int, header: ForeignHeader, wanted: Collection[str]
) -> dict[str, np.ndarray[Any, Any]]:
    """Reads the named tensors, one thread per core, into one buffer.

    Raises:
      FormatError: if the file shrinks while it is read.
    """
    todo = [t for t in header.tensors if t.name in wanted]
    raw = read_ranges(
        fd, todo, header.data_start, header.path, None, truncated_hint=BAD_FILE_HINT, quote=True
    )
    out = {t.name: b.view(t.dtype.newbyteorder("<")).reshape(t.shape) for t, b in zip(todo, raw)}
    for t in todo:
        check_bools(out[t.name], f"tensor {t.name[:200]!r}", header.path)
    return out


def check_bools(arr: np.ndarray[Any, Any], where: str, name: str) -> None:
    """Refuses a bool array holding a byte other than 0 or 1: numpy's results on
    one are undefined, and two files meaning the same values would hash apart."""
    if arr.dtype == np.bool_ and arr.size:
        raw = arr.view(np.uint8)
        if int(raw.max()) > 1:
            at = int(np.argmax(raw.reshape(-1) > 1))
            raise FormatError(
                f"{where}: element {at:,} is a byte other than 0 or 1, which no bool is",
                context=name,
                hint="the bytes are corrupt or forged; get a fresh copy from where the "
                "weights came from",
            )


def check_unverified(
    unverified: Any, name: str, *, stacklevel: int, expect_digest: str | None = None
) -> None:
    """Refuses, warns about or allows a load that no hash checks.

    A recorded digest is checked first: no ``unverified`` setting lets a file
    without one pass for the checkpoint it was recorded for.
    """
    if expect_digest is not None:
        raise _no_digest(expect_digest, name)
    if unverified not in ("refuse", "warn", "allow"):
        raise ValueError(f"unverified must be 'refuse', 'warn' or 'allow', got {unverified!r}")
    if unverified == "refuse":
        raise FormatError(
            "a safetensors file treeguard did not write: it holds no hashes and no "
            "contract, so nothing in it can be verified",
            context=name,
            hint=_UNVERIFIED_HINT,
        )
    if unverified == "warn":
        warnings.warn(UnverifiedWeightsWarning(name), stacklevel=stacklevel + 1)


def _no_digest(expect_digest: str, name: str) -> IntegrityError:
    return IntegrityError(
        f"the file carries no treeguard digest, {expect_digest[:12]}… was recorded; "
        "it is not the checkpoint whose digest was recorded",
        context=name,
        path="__metadata__",
        hint="restore the file from a verified copy (ArtifactStore.rollback)",
    )


def load_foreign(  # noqa: PLR0917 - one call site, in ``load``
    fd: int,
    header: ForeignHeader,
    like: Any,
    names: NamingRule,
    rename: Mapping[str, str],
    allow_missing: Collection[str],
    expect_digest: str | None,
) -> Any:
    """``load`` of a foreign file, after ``check_unverified`` let it through."""
    if expect_digest is not None:
        raise _no_digest(expect_digest, header.path)
    if like is None:
        namer(names)  # an unknown rule is a ValueError before anything else
        arrays = read_tensors(fd, header, {t.name for t in header.tensors})
        return nest(arrays, names, header.path)
    m = match(header, like, names=names, rename=rename, allow_missing=allow_missing)
    arrays = read_tensors(fd, header, {s for s in m.sources if s is not None})
    return build(m, arrays)


def build(m: _Match, arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
    """The tree in ``like``'s structure, each leaf in the form of ``like``'s leaf."""
    out = []
    for i, src in enumerate(m.sources):
        ref = m.like_leaves[i] if m.like_leaves is not None else None
        out.append(ref if src is None else as_like(arrays[src], ref))
    return build_like(m.like_spec, m.like_treedef, out)
