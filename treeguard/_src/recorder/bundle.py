"""A flight-recorder bundle: the step that produced NaN or Inf, on disk.

A bundle is a directory ``NNNNNN-stepK`` (a sequence number of the
recorder's directory, then the step number) holding:

* ``state.safetensors``: a checkpoint of ``{"params", "opt_state"}`` from
  before the step, and ``"key"`` when the step took a PRNG key;
* ``batch.safetensors``: the batch, only with ``batch="record"``;
* ``BUNDLE.json``: the manifest (``treeguard.bundle/1``): the step, the
  first non-finite leaf, each file's header digest, the batch's spec and
  the digest of each of its leaves, the environment, and a digest of the
  manifest itself.

Each file is a hashed checkpoint written by ``save``. The bundle is built
under a temporary name and renamed into place in one step, so a reader sees
a whole bundle or none. Everything in the directory is reached through its
descriptor, opened without following links.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..atomic import atomic_write, fsync_dir, read_regular, stale_temp, temp_path
from ..checkpoint import load, read_header, save, verify_file
from ..checkpoint.write import leaf_digests
from ..diff import check
from ..env import environment
from ..errors import ConfigError, FormatError, IntegrityError, RecorderError, TreeguardError
from ..hashing import DEFAULT, HEX_RE, check_algorithm, digest
from ..paths import keystr
from ..spec import TreeSpec
from ..strictjson import dumps, loads

#: The manifest's format tag.
FORMAT = "treeguard.bundle/1"
MANIFEST = "BUNDLE.json"
STATE_FILE = "state.safetensors"
BATCH_FILE = "batch.safetensors"
#: Every file a bundle holds; nothing else is ever removed from one.
FILES = (MANIFEST, STATE_FILE, BATCH_FILE)
#: The largest manifest read.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: How many non-finite leaves of one tree the manifest lists.
LISTED = 64

BatchMode = Literal["record", "digest"]
BATCH_MODES: tuple[BatchMode, ...] = ("record", "digest")

_NAME = re.compile(r"^(?P<seq>\d{6})-step(?P<step>\d{1,19})$")
_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_RESTORE = "the bundle changed after it was written; use an untouched copy"


def bundle_name(seq: int, step: int) -> str:
    """The directory name of a bundle.

    Example:
      >>> bundle_name(3, 1200)
      '000003-step1200'
    """
    return f"{seq:06d}-step{step}"


def bundles_in(fd: int) -> list[tuple[int, str]]:
    """``(sequence, name)`` of each bundle directory in the directory open at
    ``fd``, oldest first (by the recorder's own counter, never a clock)."""
    found = []
    for name in os.listdir(fd):
        m = _NAME.match(name)
        if m is not None:
            found.append((int(m.group("seq")), name))
    return sorted(found)


@dataclasses.dataclass(frozen=True)
class Found:
    """The non-finite leaves of one tree of a step.

    Attributes:
      tree: how the tree is named (``"the grads"``).
      leaves: ``{path: count}`` of its leaves holding NaN or Inf.
    """

    tree: str
    leaves: Mapping[str, int]


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    return type(error).__name__


def _failed(directory: str, doing: str, error: BaseException) -> RecorderError:
    reason = _reason(error)
    if isinstance(error, TreeguardError):
        detail = error.message.splitlines()[0] if error.message else type(error).__name__
    elif isinstance(error, OSError):
        detail = error.strerror or reason
    else:
        detail = type(error).__name__
    hint = "free space or fix the directory's permissions"
    if isinstance(error, OSError) and error.errno == errno.ELOOP:
        hint = "point the recorder at a real directory; it never follows a link"
    elif isinstance(error, TreeguardError):
        hint = error.hint or "store only numeric arrays in the params, state and batch"
    return RecorderError(f"{doing}: {detail}", directory=directory, reason=reason, hint=hint)


def _open_directory(directory: str) -> int:
    """Opens (creating it if absent) the recorder's directory, never through a link."""
    try:
        return os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        return os.open(directory, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if os.path.islink(directory) else "not a directory"
            raise RecorderError(
                f"the recorder's directory is {kind}",
                directory=directory,
                reason=kind,
                hint="point the recorder at a real directory; it never follows a link",
            ) from e
        raise


def _remove_known(fd: int, name: str) -> None:
    """Removes the bundle (or temporary bundle) ``name`` in the directory open
    at ``fd``: only the files a bundle holds, then the directory if that left
    it empty; a link there is unlinked, never followed."""
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(name, dir_fd=fd)
        return
    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
    try:
        for entry in os.listdir(sub):
            if entry in FILES or stale_temp(entry) in FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=sub)
    finally:
        os.close(sub)
    with contextlib.suppress(OSError):  # something we did not write stays, with its bundle
        os.rmdir(name, dir_fd=fd)


def _tidy(fd: int, keep: int) -> None:
    """Drops the oldest bundles beyond ``keep`` and the temporary bundles of
    writers that died."""
    for name in os.listdir(fd):
        if stale_temp(name) is not None:
            with contextlib.suppress(OSError):
                _remove_known(fd, name)
    for _, name in bundles_in(fd)[:-keep]:
        with contextlib.suppress(OSError):
            _remove_known(fd, name)


def _manifest_digest(doc: Mapping[str, Any]) -> str:
    return digest(dumps({k: v for k, v in doc.items() if k != "digest"}).encode(), DEFAULT)


def write_bundle(
    directory: str,
    *,
    step: int,
    params: Any,
    opt_state: Any,
    key: Any,
    batch: Any,
    mode: BatchMode,
    found: Sequence[Found],
    keep: int,
) -> str:
    """Writes one bundle into ``directory`` and drops the oldest beyond ``keep``.

    Returns:
      The new bundle's path.

    Raises:
      RecorderError: for anything that kept the bundle from being written
        (a link or a file where the directory should be, a full disk, no
        permission, a leaf that cannot be stored), chained to its cause;
        nothing of the bundle is left behind.
    """
    directory = os.path.abspath(directory)
    try:
        fd = _open_directory(directory)
    except RecorderError:
        raise
    except OSError as e:
        raise _failed(directory, "opening the recorder's directory failed", e) from e
    try:
        return _write_in(fd, directory, step, params, opt_state, key, batch, mode, found, keep)
    finally:
        os.close(fd)


def _write_in(  # noqa: PLR0917 - one call site, in ``write_bundle``
    fd: int, directory: str, step: int, params: Any, opt_state: Any, key: Any, batch: Any,
    mode: BatchMode, found: Sequence[Found], keep: int,
) -> str:  # fmt: skip
    try:
        existing = bundles_in(fd)
    except OSError as e:
        raise _failed(directory, "listing the recorder's directory failed", e) from e
    seq = existing[-1][0] + 1 if existing else 1
    final = bundle_name(seq, step)
    tmp = os.path.basename(temp_path(os.path.join(directory, final)))
    try:
        os.mkdir(tmp, dir_fd=fd)
    except OSError as e:
        raise _failed(directory, "creating the bundle failed", e) from e
    where = os.path.join(directory, tmp)
    doing = "writing the params and optimizer state"
    try:
        state: dict[str, Any] = {"params": params, "opt_state": opt_state}
        if key is not None:
            state["key"] = key
        save(os.path.join(where, STATE_FILE), state, metadata={"treeguard.bundle.step": step})
        files = {STATE_FILE: read_header(os.path.join(where, STATE_FILE)).digest}
        if mode == "record":
            doing = "writing the batch"
            save(os.path.join(where, BATCH_FILE), batch, metadata={"treeguard.bundle.step": step})
            header = read_header(os.path.join(where, BATCH_FILE))
            files[BATCH_FILE] = header.digest
            spec = header.spec
            digests = {t.name: t.digest for t in header.tensors}
        else:
            doing = "hashing the batch"
            spec, digests = leaf_digests(batch)
        doing = "writing the manifest"
        doc = _manifest(step, seq, found, files, mode, spec, digests, key=key is not None)
        doc["digest"] = _manifest_digest(doc)
        atomic_write(os.path.join(where, MANIFEST), (dumps(doc) + "\n").encode())
        doing = "moving the bundle into place"
        os.rename(tmp, final, src_dir_fd=fd, dst_dir_fd=fd)
        fsync_dir(directory)
    except (OSError, TreeguardError, TypeError, ValueError) as e:
        with contextlib.suppress(OSError):
            _remove_known(fd, tmp)
        raise _failed(directory, f"{doing} failed", e) from e
    with contextlib.suppress(OSError):
        _tidy(fd, keep)
    return os.path.join(directory, final)


def _manifest(  # noqa: PLR0917 - one call site, in ``_write_in``
    step: int, seq: int, found: Sequence[Found], files: dict[str, str], mode: BatchMode,
    spec: Any, digests: dict[str, str], *, key: bool,
) -> dict[str, Any]:  # fmt: skip
    """The bundle's manifest, without its own digest."""
    return {
        "format": FORMAT,
        "step": step,
        "sequence": seq,
        "first": {"tree": found[0].tree, "path": next(iter(found[0].leaves), "")}
        if found
        else None,
        "nonfinite": [
            {
                "tree": f.tree,
                "leaves": dict(list(f.leaves.items())[:LISTED]),
                "count": len(f.leaves),
            }
            for f in found
        ],
        "files": files,
        "key": key,
        "batch": {
            "mode": mode,
            "spec": loads(spec.to_json(indent=None), "the batch's spec"),
            "hash": DEFAULT,
            "digests": digests,
        },
        "environment": environment(),
    }


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A bundle read back by ``read_bundle``: its manifest checked, its
    files' hashes not yet (each load checks them).

    Attributes:
      path: the bundle's directory.
      step: the step number that produced NaN or Inf.
      first: ``(tree, path)`` of the first non-finite leaf the recorder saw.
      nonfinite: each tree that held NaN or Inf and its leaves.
      batch_mode: ``"record"`` (the batch is in the bundle) or ``"digest"``.
      batch_spec: the batch's ``TreeSpec``.
      batch_digests: the digest of each batch leaf, by tensor name.
      has_key: whether the step took a PRNG key (stored as ``['key']``).
      environment: where the step ran.
      files: each file's header digest.
    """

    path: str
    step: int
    first: tuple[str, str] | None
    nonfinite: tuple[Found, ...]
    batch_mode: BatchMode
    batch_spec: TreeSpec
    batch_digests: Mapping[str, str]
    batch_hash: str
    has_key: bool
    environment: Mapping[str, Any]
    files: Mapping[str, str]

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def verify(self) -> None:
        """Checks every file of the bundle against its recorded digest and
        every tensor against its hash, without keeping the data.

        Raises:
          IntegrityError: naming the file or tensor that changed.
          FormatError: for a file that is missing, a link or malformed.
        """
        for name, expected in self.files.items():
            verify_file(self._file(name), expect_digest=expected)

    def load_state(self, part: str, like: Any) -> Any:
        """``params`` or ``opt_state`` (or ``key``) from before the step,
        checked against ``like`` and every hash.

        Raises:
          TreeMismatchError, IntegrityError, FormatError: as ``load``.
        """
        return load(
            self._file(STATE_FILE),
            like=like,
            subtree=f"[{part!r}]",
            expect_digest=self.files[STATE_FILE],
        )

    def load_batch(self) -> Any:
        """The recorded batch (``batch="record"`` only).

        Raises:
          ConfigError: for a bundle that holds only the batch's digest.
        """
        if self.batch_mode != "record":
            raise ConfigError(
                "the bundle holds only the batch's spec and digest, not the batch",
                context=self.path,
                hint="pass the step's batch, saved with treeguard.save (--batch FILE); it is "
                "checked against the digest",
            )
        return load(
            self._file(BATCH_FILE), like=self.batch_spec, expect_digest=self.files[BATCH_FILE]
        )

    def check_batch(self, batch: Any, *, source: str = "the batch given") -> None:
        """Checks a batch against the bundle's spec and digests.

        Raises:
          TreeMismatchError: if its structure, shapes or dtypes differ.
          IntegrityError: naming every leaf whose bytes differ from the digest.
        """
        check(batch, self.batch_spec)
        _, found = leaf_digests(batch, digest=check_algorithm(self.batch_hash))
        bad = [n for n, d in found.items() if self.batch_digests.get(n) != d]
        if bad:
            raise IntegrityError(
                f"{len(bad)} batch {'leaf differs' if len(bad) == 1 else 'leaves differ'} "
                f"from the digest the bundle recorded: {', '.join(bad[:8])}"
                + (f" and {len(bad) - 8} more" if len(bad) > 8 else ""),
                path=bad[0],
                context=source,
                hint=f"pass the batch of step {self.step} exactly as the step saw it",
            )


def read_bundle(path: str | os.PathLike[str], /) -> Bundle:
    """Reads a flight-recorder bundle's manifest and checks it.

    The manifest must be a regular file (never a link), of the bundle
    format, carry its own digest, and name files that are there. The
    tensors are hashed when they are loaded (``Bundle.load_state``) or by
    ``Bundle.verify``.

    Args:
      path: the bundle's directory (``NNNNNN-stepK``).

    Returns:
      The ``Bundle``.

    Raises:
      FormatError: for a directory that holds no manifest, a link, or a
        manifest that is malformed or of another format.
      IntegrityError: if the manifest does not match its own digest.

    Example:
      >>> read_bundle("no-such-bundle")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: no-such-bundle: no flight-recorder bundle here (no BUNDLE.json)
      hint: ...
    """
    where = os.fspath(path)
    hint = "pass a bundle directory the flight recorder wrote (NNNNNN-stepK)"
    try:
        fd = os.open(where, _DIR_FLAGS)
    except OSError as e:
        kind = "a symbolic link" if os.path.islink(where) else "not a readable directory"
        if e.errno == errno.ENOENT:
            raise FormatError(
                f"no flight-recorder bundle here (no {MANIFEST})", context=where, hint=hint
            ) from None
        raise FormatError(f"the bundle is {kind}", context=where, hint=hint) from None
    try:
        try:
            raw = read_regular(MANIFEST, limit=MAX_MANIFEST_BYTES, what="manifest", dir_fd=fd)
        except FileNotFoundError:
            raise FormatError(
                f"no flight-recorder bundle here (no {MANIFEST})", context=where, hint=hint
            ) from None
        present = set(os.listdir(fd))
    finally:
        os.close(fd)
    doc = loads(raw, "the manifest", context=where, hint=hint)
    return _parse(doc, where, present)


def _field(doc: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(name) if isinstance(doc, dict) else None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FormatError(
            f"the manifest's {name!r} is missing or malformed",
            context=where,
            where=name,
            hint="the bundle is damaged; use an untouched copy",
        )
    return value


def _parse_files(doc: dict[str, Any], where: str, present: set[str]) -> dict[str, str]:
    """The manifest's files and their digests, each one present, the state among them."""
    files: dict[str, str] = _field(doc, "files", dict, where)
    for name, d in files.items():
        if name not in FILES or name == MANIFEST or not (isinstance(d, str) and HEX_RE.match(d)):
            raise FormatError(
                "the manifest's 'files' is malformed", context=where, where="files", hint=_RESTORE
            )
        if name not in present:
            raise FormatError(
                f"the bundle's {name} is missing", context=where, where=name, hint=_RESTORE
            )
    if STATE_FILE not in files:
        raise FormatError(f"the manifest names no {STATE_FILE}", context=where, hint=_RESTORE)
    return files


def _parse_nonfinite(doc: dict[str, Any], where: str) -> list[Found]:
    """The manifest's non-finite leaves, tree by tree, with their counts."""
    found: list[Found] = []
    for f in _field(doc, "nonfinite", list, where):
        leaves = _field(f, "leaves", dict, where)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in leaves.values()):
            raise FormatError(
                "the manifest's counts are malformed",
                context=where,
                where="nonfinite",
                hint=_RESTORE,
            )
        found.append(Found(_field(f, "tree", str, where), dict(leaves)))
    return found


def _parse(doc: Any, where: str, present: set[str]) -> Bundle:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        shown = doc.get("format") if isinstance(doc, dict) else None
        raise FormatError(
            f"the manifest is not of format {FORMAT}"
            + (f" (it says {shown[:40]!r})" if isinstance(shown, str) else ""),
            context=where,
            hint="read it with the treeguard version that wrote it",
        )
    recorded = _field(doc, "digest", str, where)
    if _manifest_digest(doc) != recorded:
        raise IntegrityError(
            "the manifest does not match its own digest", context=where, hint=_RESTORE
        )
    step = _field(doc, "step", int, where)
    files = _parse_files(doc, where, present)
    batch = _field(doc, "batch", dict, where)
    mode = batch.get("mode")
    if mode not in BATCH_MODES or (mode == "record") != (BATCH_FILE in files):
        raise FormatError(
            "the manifest's batch mode is malformed", context=where, where="batch", hint=_RESTORE
        )
    spec = TreeSpec.from_json(dumps(_field(batch, "spec", dict, where)))
    digests = _field(batch, "digests", dict, where)
    if list(digests) != [keystr(p) for p in spec.paths] or not all(
        isinstance(d, str) and HEX_RE.match(d) for d in digests.values()
    ):
        raise FormatError(
            "the manifest's batch digests do not match its spec",
            context=where,
            where="batch",
            hint=_RESTORE,
        )
    found = _parse_nonfinite(doc, where)
    first = doc.get("first")
    if first is not None:
        first = (_field(first, "tree", str, where), _field(first, "path", str, where))
    algorithm = batch.get("hash")
    if algorithm not in ("blake3", "sha256"):
        raise FormatError(
            "the manifest's batch hash is malformed", context=where, where="batch", hint=_RESTORE
        )
    return Bundle(
        path=where,
        step=step,
        first=first,
        nonfinite=tuple(found),
        batch_mode=mode,
        batch_spec=spec,
        batch_digests=digests,
        batch_hash=check_algorithm(algorithm),
        has_key=bool(doc.get("key")),
        environment=_field(doc, "environment", dict, where),
        files=files,
    )
