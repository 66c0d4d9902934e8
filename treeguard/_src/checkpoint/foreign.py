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
import math
import os
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
from ..keydtype import dtype_name
from ..leaf import dtype_of, summarize
from ..mismatch import Mismatch
from ..paths import Path, keystr, parse_user_path, starts_with
from ..spec import LeafSpec, TreeSpec
from ..specjson import FORMAT as SPEC_FORMAT
from .files import open_checkpoint, read_raw_header
from .format import FOREIGN, K_FORMAT, MAX_NDIM, Framed, StoredTensor, data_offsets, ok_int
from .migrate import flat_mismatches
from .names import NamingRule, index_once, namer, nest, rule_label, style_of
from .restore import as_like, build_like, read_ranges, walk_like
from .table import expanded

Unverified: TypeAlias = Literal["refuse", "warn", "allow"]

#: safetensors dtype name -> numpy dtype name, for every dtype a foreign file may hold.
FOREIGN_DTYPES: dict[str, str] = {**FOREIGN, "F8_E8M0": "float8_e8m0fnu"}  # ml_dtypes >= 0.5
#: Sub-byte dtypes are packed several to a byte; no numpy dtype holds them one per element.
_PACKED = ("F4", "F6_E2M3", "F6_E3M2")

_BAD_FILE_HINT = (
    "the header does not describe the file (truncated, or a forged header); "
    "get a fresh copy from where the weights came from"
)
_UNVERIFIED_HINT = (
    'pass unverified="allow" to load it knowing that no hash checks it '
    '(unverified="warn" to be warned each time), or turn it into a hashed checkpoint '
    "once with `treeguard import SRC DST` and load that"
)
#: The most bytes numpy lets an array's axes span, counting a 0 axis as 1.
MAX_ARRAY_BYTES = 2**63 - 1
#: The most tensors a foreign file may hold (a large mixture of experts holds about 10**5);
#: each one costs Python objects many times its bytes in the file.
MAX_TENSORS = 1_000_000


@dataclasses.dataclass(frozen=True)
class ForeignTensor(StoredTensor):
    """One tensor of a foreign safetensors file: its header entry, with no
    hash (see ``StoredTensor`` for the fields)."""


@dataclasses.dataclass(frozen=True)
class ForeignHeader(Framed):
    """The validated header of a safetensors file treeguard did not write.

    It holds no contract and no hashes: what it says about the tensors'
    places and sizes has been checked against the file, nothing else.

    Attributes:
      path: the file.
      tensors: every tensor, in the order of its bytes in the file.
      metadata: the writer's ``__metadata__`` (strings), or ``{}``.
      header_bytes: the header's length (without the 8-byte prefix).
      file_bytes: the file's size.
    """

    path: str
    tensors: tuple[ForeignTensor, ...]
    metadata: dict[str, str]
    header_bytes: int
    file_bytes: int

    @property
    def spec(self) -> TreeSpec:
        """A flat dict spec keyed by tensor name, sorted by name.

        Built from the spec's JSON form rather than by walking a tree, so that
        reading a foreign header (``treeguard spec FILE``) never imports JAX.
        """
        children = [
            [
                ["key", t.name],
                {"kind": "leaf", "shape": list(t.shape), "dtype": dtype_name(t.dtype)},
            ]
            for t in sorted(self.tensors, key=_by_name)
        ]
        return TreeSpec.from_dict(
            {"format": SPEC_FORMAT, "tree": {"kind": "dict", "children": children}}
        )


def _by_name(t: ForeignTensor) -> str:
    return t.name


def is_foreign(doc: Mapping[str, Any]) -> bool:
    """Whether a parsed safetensors header lacks treeguard's metadata."""
    meta = doc.get("__metadata__")
    return not (isinstance(meta, dict) and K_FORMAT in meta)


def foreign_header(doc: dict[str, Any], header_bytes: int, size: int, name: str) -> ForeignHeader:
    """Validates a foreign header against itself and the file's size.

    Raises:
      FormatError: naming the tensor and the field at fault.
    """
    meta = doc.get("__metadata__", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError(
            "__metadata__ must be a map of strings", context=name, hint=_BAD_FILE_HINT
        )
    data_bytes = size - 8 - header_bytes
    if len(doc) - ("__metadata__" in doc) > MAX_TENSORS:
        raise FormatError(
            f"holds more than {MAX_TENSORS:,} tensors; no model has that many",
            context=name,
            hint=_BAD_FILE_HINT,
        )
    tensors: list[ForeignTensor] = []
    for tensor, entry in doc.items():
        if tensor == "__metadata__":
            continue
        tensors.append(_tensor(tensor, expanded(entry), name))
    tensors.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            what = (
                "overlaps the one before" if t.begin < pos else f"leaves a gap after byte {pos:,}"
            )
            raise FormatError(
                f"tensor {t.name[:200]!r}: data_offsets [{t.begin}, {t.end}] {what}; "
                "tensors cover the data section exactly",
                context=name,
                hint=_BAD_FILE_HINT,
            )
        pos = t.end
    if pos != data_bytes:
        raise FormatError(
            f"the tensors cover {pos:,} bytes but the file holds {data_bytes:,} bytes of data "
            "(truncated or extended)",
            context=name,
            hint=_BAD_FILE_HINT,
        )
    return ForeignHeader(name, tuple(tensors), dict(meta), header_bytes, size)


def _tensor(tensor: str, entry: Any, name: str) -> ForeignTensor:
    where = f"tensor {tensor[:200]!r}"

    def bad(message: str) -> FormatError:
        return FormatError(f"{where}: {message}", context=name, hint=_BAD_FILE_HINT)

    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad("an entry holds exactly dtype, shape and data_offsets")
    st = entry["dtype"]
    if not isinstance(st, str) or st not in FOREIGN_DTYPES:
        shown = st[:20] if isinstance(st, str) else type(st).__name__
        if shown in _PACKED:
            raise bad(f"dtype {shown!r} packs several values into a byte; treeguard reads none")
        raise bad(
            f"unknown dtype {shown!r}; safetensors names are "
            + ", ".join(sorted(FOREIGN_DTYPES))
            + " (little-endian by definition)"
        )
    shape = entry["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(ok_int(d, 2**62) for d in shape)
    ):
        raise bad(f"shape must be a list of at most {MAX_NDIM} sizes")
    begin, end = data_offsets(entry, bad)
    dtype = dtype_of(FOREIGN_DTYPES[st])
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise bad(
            f"{summarize(tuple(shape), dtype)} needs {nbytes:,} bytes, "
            f"data_offsets {[begin, end]} give {end - begin:,}"
        )
    if math.prod(max(d, 1) for d in shape) * dtype.itemsize > MAX_ARRAY_BYTES:
        # numpy refuses such a shape even when another axis is 0 (no bytes at all),
        # so a zero-size tensor with huge axes passes the size check and fails here
        raise bad(f"shape {shape[:8]} is larger than any array can be")
    return ForeignTensor(tensor, tuple(shape), dtype, st, begin, end)


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
    unexpected = [t.name for t in sorted(header.tensors, key=_by_name) if t.name not in used]
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
        fd, todo, header.data_start, header.path, None, truncated_hint=_BAD_FILE_HINT, quote=True
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


def read_foreign_header(path: str | os.PathLike[str], /) -> ForeignHeader | None:
    """The validated header of a foreign safetensors file; None for a treeguard
    checkpoint or a file whose header is not safetensors JSON at all.

    Raises:
      FormatError: for a foreign header that does not describe its file.
    """
    try:
        fd, name = open_checkpoint(path)
    except (FormatError, OSError):
        return None
    try:
        try:
            doc, header_bytes, size = read_raw_header(fd, name)
        except FormatError:
            return None
        if not is_foreign(doc):
            return None
        return foreign_header(doc, header_bytes, size, name)
    finally:
        os.close(fd)
