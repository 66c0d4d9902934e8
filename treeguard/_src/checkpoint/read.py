"""Reading treeguard checkpoints: ``read_header``, ``verify_file`` and the
native half of ``load`` (``load.py`` opens a file and dispatches here or to
the foreign reader).

Each reader opens the file once and reads everything through that one
descriptor: the header, the optional ``expect_digest`` comparison, the
contract check against ``like`` (of the selected part, for a partial load)
and only then the selected tensors, each straight into its final numpy
buffer while ``hashing.read_spans`` hashes the chunks already read. No tree
is returned before every hash matched.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from ..diff import mismatches
from ..errors import ConfigError, FormatError, IntegrityError, InvalidTreeError, TreeMismatchError
from ..hashing import HEX_RE, ShortRead, Source, hash_ranges
from ..keydtype import dtype_name, is_key_dtype, wrap_keys
from ..leaf import summarize
from ..mismatch import Mismatch
from ..paths import keystr, parse, starts_with
from ..spec import TreeSpec, spec_of
from ..surgery import Change, Surgery
from ..walk import flatten
from .files import open_checkpoint, read_raw_header
from .format import Header, TensorInfo, header_from_doc
from .migrate import migrate
from .restore import (
    RESTORE_HINT,
    as_like,
    build_like,
    integrity_error,
    plain,
    read_ranges,
)
from .select import select


def _parse_header(fd: Source, name: str, expect_digest: str | None = None) -> Header:
    doc, header_bytes, size = read_raw_header(fd, name)
    return checked_header(doc, header_bytes, size, name, expect_digest)


def checked_header(
    doc: dict[str, Any], header_bytes: int, size: int, name: str, expect_digest: str | None
) -> Header:
    header = header_from_doc(doc, header_bytes, size, name)
    if expect_digest is not None and header.digest != expect_digest:
        raise IntegrityError(
            f"the file changed since its digest was recorded: header digest "
            f"{header.digest[:12]}… in the file, {expect_digest[:12]}… recorded",
            context=name,
            path="__metadata__",
            hint=RESTORE_HINT,
        )
    return header


def check_expect_digest(expect_digest: Any) -> None:
    if expect_digest is None:
        return
    if not isinstance(expect_digest, str) or not HEX_RE.match(expect_digest):
        shown = type(expect_digest).__name__ if not isinstance(expect_digest, str) else "text"
        raise ValueError(f"expect_digest is a hex digest (64 lowercase hex digits), got {shown}")


def read_header(path: str | os.PathLike[str], /) -> Header:
    """Reads and validates a checkpoint's header; reads no tensor data.

    Args:
      path: a file written by ``save``.

    Returns:
      The ``Header``: stored spec, tensor table, environment and metadata.

    Raises:
      FormatError: for a file that is not a treeguard checkpoint, is a
        symbolic link, is truncated, oversized, of an unknown format version,
        or whose header is malformed or disagrees with the file's size.
      IntegrityError: if the header's contents do not match its digest.
      OSError: if the file cannot be opened.

    Example:
      >>> import os, tempfile, numpy as np
      >>> from treeguard import save
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> save(path, {"w": np.ones((2, 3), np.float32)}, metadata={"step": 7})
      >>> h = read_header(path)
      >>> h.spec, h.metadata, h.tensors[0].summary()
      (TreeSpec({'w': f32[2,3]}), {'step': 7}, 'f32[2,3]')
    """
    fd, name = open_checkpoint(path)
    try:
        return _parse_header(fd, name)
    finally:
        os.close(fd)


def verify_file(
    path: str | os.PathLike[str],
    /,
    *,
    like: Any = None,
    progress: Callable[[int, int], None] | None = None,
    expect_digest: str | None = None,
) -> Header:
    """Checks a checkpoint completely without keeping its data: the header,
    the contract (when ``like`` is given) and every tensor's hash.

    Memory stays at a few chunk buffers whatever the file's size.

    Args:
      path: the checkpoint.
      like: a tree or ``TreeSpec`` the checkpoint must match exactly.
      progress: called as ``progress(bytes_done, bytes_total)`` while hashing.
      expect_digest: the header digest recorded when the file was verified
        (``Header.digest``); the file read must carry exactly this digest,
        checked before any tensor is read.

    Returns:
      The validated ``Header``.

    Raises:
      FormatError: for a malformed, truncated or foreign file.
      TreeMismatchError: listing every difference from ``like``, before any
        data is read.
      IntegrityError: naming every tensor whose bytes do not match, or if
        the header digest is not ``expect_digest``.
      ValueError: if ``expect_digest`` is not a hex digest.

    Example:
      >>> import os, tempfile, numpy as np
      >>> from treeguard import save
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> save(path, {"w": np.ones(3, np.float32)})
      >>> verify_file(path, like={"w": np.zeros(3, np.float32)}).spec.num_leaves
      1
    """
    check_expect_digest(expect_digest)
    fd, name = open_checkpoint(path)
    try:
        return verify_source(fd, name, like=like, progress=progress, expect_digest=expect_digest)
    finally:
        os.close(fd)


def verify_source(
    src: Source,
    name: str,
    *,
    like: Any = None,
    progress: Callable[[int, int], None] | None = None,
    expect_digest: str | None = None,
) -> Header:
    """``verify_file`` of a checkpoint read from ``src``: an open descriptor,
    or a ``RangeReader`` (an object in a bucket, hashed as it downloads);
    ``name`` is how messages name it."""
    header = _parse_header(src, name, expect_digest)
    if like is not None:
        like_spec = like if isinstance(like, TreeSpec) else spec_of(like)
        found = _contract_mismatches(header.spec, like_spec)
        if found:
            raise TreeMismatchError(
                found, expected_from="`like`", actual_from="the checkpoint", context=name
            )
    ranges = [(header.data_start + t.begin, t.nbytes) for t in header.tensors]
    try:
        digests = hash_ranges(src, ranges, header.hash_name, progress=progress)
    except ShortRead:
        raise FormatError(
            "the file was truncated while it was verified", context=name, hint=RESTORE_HINT
        ) from None
    bad = [(t, d, t.digest) for t, d in zip(header.tensors, digests) if d != t.digest]
    if bad:
        raise integrity_error(name, header.hash_name, bad)
    return header


def load_source(  # noqa: PLR0917 - one call site, all positional data
    src: Source,
    name: str,
    like: Any,
    expect_digest: str | None,
    subtree: str | None,
    ignore: Collection[str],
) -> Any:
    """``load`` of a treeguard checkpoint read from ``src`` (a descriptor or
    a ``RangeReader``), without surgery: the header and its digest, the
    selection and the contract, then the selected tensors, every hash checked
    as they arrive."""
    check_expect_digest(expect_digest)
    header = _parse_header(src, name, expect_digest)
    surgery = SurgeryOptions("error", None, "error")
    return load_native(src, header, like, {}, (), subtree, ignore, surgery)[0]


def _contract_mismatches(stored: TreeSpec, like: TreeSpec) -> list[Mismatch]:
    """Mismatches between a stored spec and the expected one. Weak types are
    not compared: no file keeps them, and ``load`` gives each leaf ``like``'s."""
    return [m for m in mismatches(stored, like) if m.kind != "weak_type"]


def read_verified(fd: Source, header: Header, todo: Sequence[TensorInfo]) -> list[Any]:
    """Reads these tensors and verifies every hash: the one function a load
    reads checkpoint bytes with; each comes back as an array of its dtype.

    Raises:
      IntegrityError: naming every tensor whose bytes differ from its hash.
      FormatError: if the file shrinks while it is read.
    """
    raw = read_ranges(
        fd, todo, header.data_start, header.path, [t.digest for t in todo], header.hash_name
    )
    out: list[Any] = []
    for t, b in zip(todo, raw):
        arr = b.view(t.dtype).reshape(t.shape)
        out.append(wrap_keys(arr) if is_key_dtype(t.dtype) else arr)
    return out


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


def _all_text(x: Any) -> bool:
    return isinstance(x, (list, tuple, set, frozenset)) and all(isinstance(t, str) for t in x)


def load_native(  # noqa: PLR0917 - two call sites, all positional data
    fd: Source,
    header: Header,
    like: Any,
    rename: Mapping[str, str],
    allow_missing: Collection[str],
    subtree: str | None,
    ignore: Collection[str],
    surgery: SurgeryOptions,
) -> tuple[Any, Surgery]:
    """``load`` of a treeguard checkpoint whose header was checked: the
    selection, then the contract, then the selected tensors, verified.
    Returns the tree and what was changed on the way."""
    named = [] if isinstance(surgery.unexpected, str) else list(surgery.unexpected)
    if subtree is not None or ignore or named:
        left_out = ignore if isinstance(ignore, str) else [*ignore, *named]  # str: refused
        sel = select(header.spec, subtree=subtree, ignore=left_out, where=header.path)
        stored, tensors = sel.spec, [header.tensors[i] for i in sel.indices]
    else:
        stored, tensors = header.spec, list(header.tensors)
    plan = _plan(stored, header.path, like, rename, tuple(allow_missing), surgery)
    wanted = sorted({k for k in plan.sources if k is not None})
    arrays = dict(zip(wanted, read_verified(fd, header, [tensors[k] for k in wanted])))
    report = plan.surgery
    if named:  # dropped by name: never read, reported by their paths in the file
        cut = [parse(t) for t in named]
        gone = [
            Change("dropped", keystr(p), _ints(r[0]), dtype_name(r[1]))
            for p, r in zip(header.spec.paths, header.spec.records)
            if any(starts_with(p, c) for c in cut)
        ]
        report = Surgery.of([*report.changes, *gone], report.source)
    return plan.build(arrays), report


@dataclasses.dataclass(frozen=True)
class _Plan:
    """For each leaf of the result, the stored leaf it is read from (None:
    it keeps ``like``'s value or takes its ``init`` value), how to build the
    tree from the arrays read, and the report of what changed."""

    sources: list[int | None]
    build: Callable[[dict[int, np.ndarray[Any, Any]]], Any]
    surgery: Surgery


def _plan(  # noqa: PLR0917 - one call site
    stored: TreeSpec,
    where: str,
    like: Any,
    rename: Mapping[str, str],
    allow_missing: Sequence[str],
    surgery: SurgeryOptions,
) -> _Plan:
    """Checks the contract and plans the load; raises before any read."""
    if like is None:
        root = stored.structure

        def build_plain(arrays: dict[int, np.ndarray[Any, Any]]) -> Any:
            return plain(root, iter([arrays[k] for k in range(stored.num_leaves)]))

        return _Plan(list(range(stored.num_leaves)), build_plain, Surgery.of((), where))
    if isinstance(like, TreeSpec):
        like_spec, like_leaves, like_treedef = like, None, None
    else:
        like_spec = spec_of(like)
        like_leaves, like_treedef = flatten(like)
    if not rename and not allow_missing and not surgery.active:
        found = _contract_mismatches(stored, like_spec)
        if found:
            raise TreeMismatchError(
                found, expected_from="`like`", actual_from="the checkpoint", context=where
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

    def build(arrays: dict[int, np.ndarray[Any, Any]]) -> Any:
        out: list[Any] = []
        for i, src in enumerate(sources):
            ref = like_leaves[i] if like_leaves is not None else None
            if src is not None:
                out.append(as_like(arrays[src], ref))
            else:
                out.append(values.get(i, ref))
        return build_like(like_spec, like_treedef, out)

    return _Plan(sources, build, report)


def _init_values(
    init: Any, fresh: Sequence[int], like_names: Sequence[str], like_spec: TreeSpec, where: str
) -> dict[int, Any]:
    """The value of each leaf to initialise, from ``init`` (a tree, matched by
    key path, or a function of the key path), checked against ``like``.

    Raises:
      TreeMismatchError: listing every leaf ``init`` lacks or gives another
        shape or dtype.
    """
    if callable(init) and not hasattr(init, "shape"):
        given = {i: init(like_names[i]) for i in fresh}
        origin = "`init(path)`"
    else:
        by_path = dict(zip((keystr(p) for p in spec_of(init).paths), flatten(init)[0]))
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
            "and dtype: pass the new model's params",
        )
    return given


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
