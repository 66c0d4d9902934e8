"""The artifact store: the lifecycle of a model's weights on one host.

A store is a directory::

    ROOT/
      CURRENT.json              the pointer: current version and the stack of
                                previously current ones (replaced atomically)
      log.jsonl                 one JSON event per line: put, verify, promote, ...
      versions/
        v000001/
          model.safetensors     a checkpoint written by ``checkpoint.save``
          status.json           status (writing, candidate, verified,
                                rejected), the reason, the checks, the env

A version moves candidate -> verified or rejected by ``verify``; only a
verified version can be promoted to current. ``rollback`` returns to the
previous verified version and ``gc`` never removes the current one or that
previous one. Every change to the pointer and every status file is written to
a temp file, fsynced and renamed, under an exclusive lock, so a crash or two
processes at once leave a consistent store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .checkpoint import (
    _pid_alive,
    load,
    read_header,
    remove_stale_temps,
    save,
    user_metadata_json,
    verify_file,
)
from .env import environment
from .errors import FormatError, IntegrityError, TreeguardError, TreeMismatchError
from .spec import TreeSpec, summarize

STORE_FORMAT = "treeguard.store/1"
MODEL_FILE = "model.safetensors"
STATUS_FILE = "status.json"
POINTER_FILE = "CURRENT.json"
LOG_FILE = "log.jsonl"
_VERSIONS = "versions"
_LOCK = ".lock"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_AUTO_RE = re.compile(r"^v(\d{6,})$")
STATUSES = ("writing", "candidate", "verified", "rejected")
#: The status ``versions`` gives a version whose ``status.json`` cannot be
#: read; its ``reason`` says why. Nothing changes such a version, ``gc`` included.
UNREADABLE = "unreadable"

#: A check run by ``verify``: a callable taking the loaded tree, or a
#: ``(name, callable)`` pair. It passes by returning None or any true value
#: (``True``, ``np.True_``, a true 0-d jax array) and fails by returning a
#: false one (``False``, ``np.False_``, ``0``) or raising; an array of another
#: shape is no truth value and fails too.
Check = Callable[[Any], object] | tuple[str, Callable[[Any], object]]


class StoreError(TreeguardError, ValueError):
    """The store refused an operation: promoting an unverified version,
    rolling back with no previous verified version, a corrupt pointer."""


class UnknownVersionError(StoreError, LookupError):
    """No such version in the store, or a name that cannot be a version
    (one that would escape the store's root)."""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check run by ``verify``.

    Attributes:
      name: the check's name.
      ok: whether it passed.
      detail: why it failed, or a short note.
    """

    name: str
    ok: bool
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    """A version's record, read from its ``status.json``.

    Attributes:
      version: the name.
      status: ``writing``, ``candidate``, ``verified`` or ``rejected``;
        ``unreadable`` (from ``versions`` only) if its ``status.json`` is
        damaged.
      reason: why it was rejected or is unreadable (or a note), else None.
      created: when it was put, ISO 8601 in UTC.
      updated: when its status last changed.
      metadata: the caller's metadata given to ``put``.
      checks: the checks the last ``verify`` ran.
      contract: what the last ``verify`` compared the structure with.
      num_leaves: the leaf count.
      num_params: the element count.
      nbytes: the bytes of array data.
      digest: the checkpoint's header digest when it was verified.
      path: the checkpoint file.
    """

    version: str
    status: str
    reason: str | None
    created: str
    updated: str
    metadata: dict[str, Any]
    checks: tuple[CheckResult, ...]
    contract: str | None
    num_leaves: int | None
    num_params: int | None
    nbytes: int | None
    digest: str | None
    path: str


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of the store's log.

    Attributes:
      time: ISO 8601 in UTC.
      action: ``put``, ``verify``, ``promote``, ``rollback``, ``gc`` or
        ``fallback``.
      version: the version acted on (the new current for promote and
        rollback), or None.
      detail: the rest: status, reason, previous current, removed versions.
    """

    time: str
    action: str
    version: str | None
    detail: dict[str, Any]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _write_json(path: str, data: Any) -> None:
    """Atomically replaces ``path`` with JSON a person can read."""
    dirname = os.path.dirname(path)
    tmp = os.path.join(
        dirname, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    )
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fd = os.open(dirname, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: str, what: str) -> Any:
    if os.path.islink(path):
        raise StoreError(f"{path}: {what} is a symbolic link; the store never follows links")
    with open(path, "rb") as f:
        raw = f.read(16 * 1024 * 1024 + 1)
    if len(raw) > 16 * 1024 * 1024:
        raise StoreError(f"{path}: {what} is larger than 16 MiB")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise StoreError(f"{path}: {what} is not valid JSON: {e}") from None


class ArtifactStore:
    """Versions of a model's weights, with verify, promote, rollback and gc.

    Args:
      root: the store's directory; created if absent.

    Example:
      >>> import tempfile, numpy as np
      >>> store = ArtifactStore(tempfile.mkdtemp())
      >>> params = {"w": np.ones((2, 3), np.float32)}
      >>> v1 = store.put(params, metadata={"step": 100})
      >>> store.verify(v1, checks=[lambda tree: bool(np.isfinite(tree["w"]).all())]).status
      'verified'
      >>> store.promote(v1)
      >>> store.current() == v1, store.load_current(params)["w"].shape
      (True, (2, 3))
      >>> v2 = store.put({"w": np.ones((3, 2), np.float32)})
      >>> print(store.verify(v2).reason)
      contract: 1 mismatch between the checkpoint and version v000001 (current):
        ['w']: shape (2, 3) in version v000001 (current), (3, 2) in the checkpoint
      hint: ...
      >>> store.promote(v2)
      Traceback (most recent call last):
      ...
      treeguard._src.store.StoreError: version v000002 is rejected, not verified: ...
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if os.path.islink(self.root):
            raise StoreError(f"{self.root}: the store root is a symbolic link; pass its target")
        os.makedirs(os.path.join(self.root, _VERSIONS), exist_ok=True)

    def __repr__(self) -> str:
        return f"ArtifactStore({self.root!r})"

    # -- paths and locking -----------------------------------------------

    def _version_dir(self, version: str) -> str:
        if not isinstance(version, str) or not _NAME_RE.match(version) or ".." in version:
            raise UnknownVersionError(
                f"{version!r} is not a version name: names are 1-128 letters, digits, '.', "
                "'_' or '-', starting with a letter or digit, so none escapes the store root"
            )
        base = os.path.join(self.root, _VERSIONS)
        path = os.path.join(base, version)
        if os.path.dirname(os.path.abspath(path)) != base:  # pragma: no cover - regex forbids it
            raise UnknownVersionError(f"{version!r} escapes the store root")
        return path

    def _existing_dir(self, version: str) -> str:
        path = self._version_dir(version)
        if os.path.islink(path):
            raise UnknownVersionError(f"version {version} is a symbolic link; refused")
        if not os.path.isfile(os.path.join(path, STATUS_FILE)):
            known = ", ".join(v.version for v in self.versions()[-5:]) or "none"
            raise UnknownVersionError(
                f"no version {version} in the store {self.root} (latest: {known})"
            )
        return path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.root, _LOCK), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if sys.platform != "win32":
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _log(self, action: str, version: str | None, **detail: Any) -> None:
        line = json.dumps(
            {"time": _now(), "action": action, "version": version, "detail": detail},
            sort_keys=True,
            ensure_ascii=False,
        )
        fd = os.open(
            os.path.join(self.root, LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666
        )
        try:
            os.write(fd, (line + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- status files ----------------------------------------------------

    def _status(self, version: str) -> dict[str, Any]:
        path = os.path.join(self._existing_dir(version), STATUS_FILE)
        data = _read_json(path, "status.json")
        if not isinstance(data, dict) or data.get("status") not in STATUSES:
            status = data.get("status") if isinstance(data, dict) else None
            raise StoreError(
                f"{path}: status.json is malformed: status {str(status)[:40]!r} is not one of "
                f"{', '.join(STATUSES)}\n{_STATUS_HINT}"
            )
        return data

    def _write_status(self, version: str, data: dict[str, Any]) -> None:
        data = {**data, "format": STORE_FORMAT, "version": version, "updated": _now()}
        _write_json(os.path.join(self._version_dir(version), STATUS_FILE), data)

    def info(self, version: str, /) -> VersionInfo:
        """The record of one version.

        Args:
          version: the version's name.

        Returns:
          Its ``VersionInfo``, read from its ``status.json``.

        Raises:
          UnknownVersionError: for a version that does not exist or a bad name.
          StoreError: if its ``status.json`` is malformed (naming the file).

        Example:
          >>> import tempfile, numpy as np
          >>> store = ArtifactStore(tempfile.mkdtemp())
          >>> v = store.put({"w": np.ones(3, np.float32)}, metadata={"step": 1})
          >>> info = store.info(v)
          >>> info.status, info.metadata, info.num_params
          ('candidate', {'step': 1}, 3)
        """
        d = self._status(version)
        where = os.path.join(self._version_dir(version), STATUS_FILE)
        for key, kinds in _FIELDS.items():
            value = d.get(key)
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                raise StoreError(
                    f"{where}: status.json is malformed: {key} is a {type(value).__name__}, "
                    f"expected {' or '.join(k.__name__ for k in kinds)}\n{_STATUS_HINT}"
                )
        return VersionInfo(
            version=version,
            status=d["status"],
            reason=d.get("reason"),
            created=d.get("created") or "",
            updated=d.get("updated") or "",
            metadata=d.get("metadata") or {},
            checks=_check_results(d.get("checks") or [], where),
            contract=d.get("contract"),
            num_leaves=d.get("num_leaves"),
            num_params=d.get("num_params"),
            nbytes=d.get("nbytes"),
            digest=d.get("digest"),
            path=os.path.join(self._version_dir(version), MODEL_FILE),
        )

    def versions(self) -> list[VersionInfo]:
        """Every version with a status record, oldest first.

        A version whose ``status.json`` cannot be read is listed last, with
        status ``unreadable`` and the error as its reason, so that a damaged
        record is reported rather than hidden.

        Returns:
          One ``VersionInfo`` per version.

        Example:
          >>> import tempfile, numpy as np
          >>> store = ArtifactStore(tempfile.mkdtemp())
          >>> _ = store.put({"w": np.ones(3, np.float32)})
          >>> [(v.version, v.status) for v in store.versions()]
          [('v000001', 'candidate')]
        """
        base = os.path.join(self.root, _VERSIONS)
        out: list[VersionInfo] = []
        for name in os.listdir(base):
            if not _NAME_RE.match(name) or ".." in name:
                continue
            path = os.path.join(base, name)
            if os.path.islink(path) or not os.path.isfile(os.path.join(path, STATUS_FILE)):
                continue
            try:
                out.append(self.info(name))
            except StoreError as e:
                out.append(_unreadable(name, str(e), os.path.join(path, MODEL_FILE)))
        return sorted(out, key=lambda v: (v.status == UNREADABLE, v.created, v.version))

    # -- the pointer -----------------------------------------------------

    def _pointer(self) -> dict[str, Any]:
        path = os.path.join(self.root, POINTER_FILE)
        if not os.path.exists(path) and not os.path.islink(path):
            return {"current": None, "previous": []}
        data = _read_json(path, POINTER_FILE)
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("previous", []), list)
            or not isinstance(data.get("current"), (str, type(None)))
        ):
            raise StoreError(f"{path}: not a store pointer")
        return data

    def _set_pointer(self, current: str | None, previous: Sequence[str]) -> None:
        _write_json(
            os.path.join(self.root, POINTER_FILE),
            {
                "format": STORE_FORMAT,
                "current": current,
                "previous": list(previous),
                "updated": _now(),
            },
        )

    def current(self) -> str | None:
        """The current version's name, or None before the first promotion."""
        cur = self._pointer().get("current")
        return cur if isinstance(cur, str) else None

    def previous(self) -> str | None:
        """The version ``rollback`` would return to: the most recent formerly
        current version that is still verified; None if there is none."""
        return self._previous_verified(self._pointer())[0]

    def _previous_verified(self, pointer: Mapping[str, Any]) -> tuple[str | None, list[str]]:
        stack = [v for v in pointer.get("previous", []) if isinstance(v, str)]
        for i, v in enumerate(stack):
            try:
                if self._status(v)["status"] == "verified":
                    return v, stack[i + 1 :]
            except StoreError:
                continue
        return None, []

    # -- the lifecycle ---------------------------------------------------

    def put(
        self,
        tree: Any,
        /,
        *,
        metadata: Mapping[str, Any] | None = None,
        version: str | None = None,
    ) -> str:
        """Saves a tree as a new candidate version.

        Args:
          tree: the parameters.
          metadata: JSON-serialisable data kept with the version.
          version: a name for it; by default the next ``v000001``, ``v000002``...

        Returns:
          The version's name.

        Raises:
          StoreError: if the named version exists.
          UnknownVersionError: for a name that is not allowed.
          InvalidTreeError: for a tree that cannot be saved.
          TypeError: for metadata that is not JSON, naming the key; nothing
            is created then.

        A failure at any step removes the version's directory, so the next
        ``put`` gets the same name.
        """
        user = json.loads(user_metadata_json(metadata))  # refuse bad metadata before any write
        with self._locked():
            if version is None:
                version = self._next_name()
            path = self._version_dir(version)
            try:
                os.mkdir(path)
            except FileExistsError:
                raise StoreError(f"version {version} already exists in {self.root}") from None
            try:
                self._write_status(
                    version,
                    {
                        "status": "writing",
                        "pid": os.getpid(),
                        "created": _now(),
                        "metadata": user,
                        "reason": None,
                    },
                )
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
        try:
            save(os.path.join(path, MODEL_FILE), tree, metadata=user)
            header = read_header(os.path.join(path, MODEL_FILE))
            with self._locked():
                status = self._status(version)
                status.update(
                    status="candidate",
                    pid=None,
                    num_leaves=header.spec.num_leaves,
                    num_params=header.spec.num_params,
                    nbytes=header.spec.nbytes,
                )
                self._write_status(version, status)
                self._log("put", version, status="candidate")
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return version

    def _next_name(self) -> str:
        base = os.path.join(self.root, _VERSIONS)
        numbers = [int(m.group(1)) for n in os.listdir(base) if (m := _AUTO_RE.match(n))]
        return f"v{max(numbers, default=0) + 1:06d}"

    def verify(
        self,
        version: str,
        /,
        *,
        like: Any = None,
        checks: Sequence[Check] = (),
    ) -> VersionInfo:
        """Checks a version and records it as verified or rejected.

        The checkpoint is loaded with every hash checked, and its structure
        compared with the contract: ``like`` when given, else the current
        version's spec (so a candidate of another structure is rejected),
        else (the first version) only its own stored spec. Then each check
        runs on the loaded tree. The first failure rejects the version with
        its reason; a version is verified only if everything passes.

        Args:
          version: the version to check.
          like: the tree or ``TreeSpec`` it must match; its structure is
            also the one the checks receive.
          checks: callables taking the tree, or ``(name, callable)`` pairs.
            A check passes by returning None or a true value, fails by
            returning a false one (``False``, ``np.False_``, a false 0-d jax
            array) or raising; a returned array of any other shape fails, as
            it is no truth value.

        Returns:
          The updated ``VersionInfo``; ``status`` is ``verified`` or
          ``rejected`` (see ``reason``).

        Raises:
          UnknownVersionError: for an unknown version.
          StoreError: for a version still being written (status
            ``writing``), or whose ``status.json`` is malformed.
        """
        before = self.info(version)
        if before.status == "writing":
            pid = self._status(version).get("pid")
            raise StoreError(
                f"version {version} is still being written (by process {pid}); there is no "
                "complete checkpoint to verify yet\n"
                "hint: verify it once its put returns; if that process died, store.gc() removes it"
            )
        path = os.path.join(self._version_dir(version), MODEL_FILE)
        contract_name: str
        if like is not None:
            contract, contract_name = like, "`like`"
        else:
            cur = self.current()
            if cur is not None and cur != version:
                contract = read_header(os.path.join(self._version_dir(cur), MODEL_FILE)).spec
                contract_name = f"version {cur} (current)"
            else:
                contract, contract_name = None, "its own stored spec"
        results: list[CheckResult] = []
        reason: str | None = None
        digest: str | None = None
        try:
            digest = read_header(path).digest
            tree = load(path, like=contract)
            results.append(CheckResult("integrity", True, "header and every tensor hash match"))
            results.append(CheckResult("contract", True, f"matches {contract_name}"))
        except TreeMismatchError as e:
            text = str(e).replace("`like`", contract_name)
            text = text.split(": ", 1)[1] if text.startswith(path) else text
            reason = f"contract: {text}"
            results.append(CheckResult("integrity", True, "header valid"))
            results.append(CheckResult("contract", False, text))
        except (IntegrityError, FormatError, OSError) as e:
            reason = f"integrity: {e}"
            results.append(CheckResult("integrity", False, str(e)))
        if reason is None:
            for i, check in enumerate(checks):
                name, fn = check if isinstance(check, tuple) else (_check_name(check, i), check)
                try:
                    ok = fn(tree)
                except Exception as e:  # noqa: BLE001 - a check's failure is data here
                    results.append(CheckResult(name, False, f"{type(e).__name__}: {e}"))
                    reason = f"check {name} raised {type(e).__name__}: {e}"
                    break
                failure = _check_failure(ok)
                if failure is not None:
                    results.append(CheckResult(name, False, failure))
                    reason = f"check {name} {failure}"
                    break
                results.append(CheckResult(name, True))
        with self._locked():
            status = self._status(version)
            status.update(
                status="rejected" if reason else "verified",
                reason=reason,
                checks=[dataclasses.asdict(r) for r in results],
                contract=contract_name,
                digest=digest if reason is None else status.get("digest"),
                verified_env=environment(),
            )
            self._write_status(version, status)
            self._log("verify", version, status=status["status"], reason=reason)
        return self.info(version)

    def promote(self, version: str, /) -> None:
        """Makes a verified version current; the old current becomes the one
        ``rollback`` returns to.

        The checkpoint is checked again first, under the store's lock: its
        header must be the one verified and every tensor's bytes must still
        match their hashes (the whole file is read), so a byte changed since
        ``verify`` is never promoted.

        Args:
          version: the version to make current.

        Raises:
          StoreError: if the version is not verified, or its file changed
            since it was verified (naming the changed tensors).
          UnknownVersionError: for an unknown version.
        """
        with self._locked():
            status = self._status(version)
            if status["status"] != "verified":
                why = f": {status['reason']}" if status.get("reason") else ""
                raise StoreError(
                    f"version {version} is {status['status']}, not verified{why}\n"
                    f"hint: run store.verify({version!r}) first; "
                    "only a verified version is promoted"
                )
            path = os.path.join(self._version_dir(version), MODEL_FILE)
            try:
                digest = verify_file(path).digest
            except IntegrityError as e:
                raise StoreError(
                    f"version {version}: its checkpoint changed since it was verified: {e}"
                ) from e
            except (FormatError, OSError) as e:
                raise StoreError(f"version {version}: its checkpoint no longer reads: {e}") from e
            if digest != status.get("digest"):
                raise StoreError(
                    f"version {version}: its checkpoint changed since it was verified "
                    f"(header digest {digest[:12]}… now, {str(status.get('digest'))[:12]}… then)\n"
                    "hint: verify it again"
                )
            pointer = self._pointer()
            old = pointer.get("current")
            if old == version:
                return
            stack = [v for v in pointer.get("previous", []) if v != version]
            if isinstance(old, str):
                stack.insert(0, old)
            self._set_pointer(version, stack)
            self._log("promote", version, previous=old)

    def rollback(self) -> str:
        """Makes the previous verified version current again.

        Returns:
          The version now current.

        Raises:
          StoreError: if there is no previous verified version.
        """
        with self._locked():
            pointer = self._pointer()
            target, rest = self._previous_verified(pointer)
            if target is None:
                raise StoreError(
                    f"{self.root}: no previous verified version to roll back to "
                    f"(current: {pointer.get('current')})"
                )
            self._set_pointer(target, rest)
            self._log("rollback", target, previous=pointer.get("current"))
            return target

    def load_version(self, version: str, /, like: Any = None) -> Any:
        """Loads one version, verified (see ``checkpoint.load``)."""
        self._existing_dir(version)
        return load(os.path.join(self._version_dir(version), MODEL_FILE), like=like)

    def load_verified(self, version: str, /, like: Any = None) -> Any:
        """Loads a version only if it is verified and its file still has the
        digest recorded when it was verified.

        Raises:
          StoreError: if the version is not verified.
          IntegrityError: naming the version, if its file changed since.
        """
        status = self.info(version)
        if status.status != "verified":
            raise StoreError(
                f"version {version} is {status.status}, not verified\n"
                f"hint: run store.verify({version!r}) first"
            )
        path = os.path.join(self._version_dir(version), MODEL_FILE)
        try:
            digest = verify_file(path).digest
        except (IntegrityError, FormatError) as e:
            raise IntegrityError(f"version {version}: its checkpoint is damaged: {e}") from e
        if digest != status.digest:
            raise IntegrityError(
                f"version {version}: its checkpoint changed since it was verified\n"
                "hint: verify it again"
            )
        return self.load_version(version, like)

    def log_event(self, action: str, version: str | None, /, **detail: Any) -> None:
        """Appends one event to the store's log."""
        with self._locked():
            self._log(action, version, **detail)

    def load_current(self, like: Any = None, *, fallback: bool = False) -> Any:
        """Loads the current version, with every hash checked.

        Args:
          like: the tree or ``TreeSpec`` whose structure the result takes.
          fallback: if the current file fails its integrity check, load the
            previous verified version instead (the fall back is logged).

        Returns:
          The tree.

        Raises:
          StoreError: if nothing was promoted yet.
          IntegrityError, FormatError: if the current file is damaged (and,
            with ``fallback``, every previous verified one too).
          TreeMismatchError: if it does not match ``like``.
        """
        pointer = self._pointer()
        cur = pointer.get("current")
        if not isinstance(cur, str):
            raise StoreError(f"{self.root}: no current version; promote a verified one first")
        try:
            return self.load_version(cur, like)
        except (IntegrityError, FormatError, OSError) as first:
            if not fallback:
                raise
            for v in pointer.get("previous", []):
                try:
                    if self._status(v)["status"] != "verified":
                        continue
                    tree = self.load_version(v, like)
                except (IntegrityError, FormatError, OSError, StoreError):
                    continue
                with self._locked():
                    self._log("fallback", v, current=cur, reason=str(first).splitlines()[0])
                return tree
            raise

    def history(self) -> list[Event]:
        """Every logged event, oldest first."""
        path = os.path.join(self.root, LOG_FILE)
        if not os.path.exists(path):
            return []
        out: list[Event] = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    d = json.loads(line)
                    out.append(
                        Event(d["time"], d["action"], d.get("version"), d.get("detail") or {})
                    )
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line torn by a crash
        return out

    def gc(self, *, keep: int = 3) -> list[str]:
        """Removes old versions, keeping the ``keep`` newest, the current one,
        the previous verified one, any still being written and any whose
        ``status.json`` cannot be read (listed as ``unreadable``).

        Args:
          keep: how many of the newest versions to keep whatever their status.

        Returns:
          The versions removed.

        Raises:
          ValueError: for a negative ``keep``.
        """
        if keep < 0:
            raise ValueError(f"keep must be 0 or more, got {keep}")
        base = os.path.join(self.root, _VERSIONS)
        removed: list[str] = []
        with self._locked():
            pointer = self._pointer()
            protect = {pointer.get("current"), self._previous_verified(pointer)[0]}
            versions = self.versions()
            finished = [v for v in versions if v.status not in ("writing", UNREADABLE)]
            protect.update(v.version for v in finished[max(0, len(finished) - keep) :] if keep)
            for v in versions:
                if v.status == UNREADABLE:
                    continue  # never delete what cannot be read: a person must look
                if v.status == "writing":
                    pid = self._status(v.version).get("pid")
                    if isinstance(pid, int) and _pid_alive(pid):
                        continue  # a put in progress
                elif v.version in protect:
                    continue
                self._trash(v.version)
                removed.append(v.version)
            for name in os.listdir(base):
                path = os.path.join(base, name)
                if name.startswith(".trash-"):
                    shutil.rmtree(path, ignore_errors=True)
                elif (
                    _NAME_RE.match(name)
                    and not os.path.islink(path)
                    and os.path.isdir(path)
                    and not os.path.exists(os.path.join(path, STATUS_FILE))
                ):
                    self._trash(name)  # reserved by a put that died before its status
                    removed.append(name)
                elif os.path.isdir(path) and not os.path.islink(path):
                    remove_stale_temps(path)
            remove_stale_temps(self.root)
            if removed:
                self._log("gc", None, removed=removed, keep=keep)
        return removed

    def _trash(self, version: str) -> None:
        """Renames a version out of sight (atomic), then deletes it."""
        base = os.path.join(self.root, _VERSIONS)
        trash = os.path.join(base, f".trash-{version}-{secrets.token_hex(4)}")
        os.replace(os.path.join(base, version), trash)
        shutil.rmtree(trash, ignore_errors=True)


_STATUS_HINT = (
    "hint: the store writes status.json itself; restore it from a backup, or delete the "
    "version's directory"
)
#: The optional fields of a status record and the JSON types each may have.
_FIELDS: dict[str, tuple[type, ...]] = {
    "reason": (str,),
    "created": (str,),
    "updated": (str,),
    "metadata": (dict,),
    "checks": (list,),
    "contract": (str,),
    "num_leaves": (int,),
    "num_params": (int,),
    "nbytes": (int,),
    "digest": (str,),
}


def _check_results(raw: list[Any], where: str) -> tuple[CheckResult, ...]:
    """The ``checks`` of a status record, validated."""
    out: list[CheckResult] = []
    for i, c in enumerate(raw):
        if (
            not isinstance(c, dict)
            or not {"name", "ok"} <= set(c) <= {"name", "ok", "detail"}
            or not isinstance(c["name"], str)
            or not isinstance(c["ok"], bool)
            or not isinstance(c.get("detail", ""), str)
        ):
            raise StoreError(
                f"{where}: status.json is malformed: checks[{i}] is not "
                f'{{"name": str, "ok": bool, "detail": str}}\n{_STATUS_HINT}'
            )
        out.append(CheckResult(c["name"], c["ok"], c.get("detail", "")))
    return tuple(out)


def _unreadable(version: str, reason: str, path: str) -> VersionInfo:
    """The record ``versions`` lists for a version whose status cannot be read."""
    return VersionInfo(
        version=version,
        status=UNREADABLE,
        reason=reason,
        created="",
        updated="",
        metadata={},
        checks=(),
        contract=None,
        num_leaves=None,
        num_params=None,
        nbytes=None,
        digest=None,
        path=path,
    )


def _check_failure(ok: object) -> str | None:
    """Why a check's result fails it, or None if it passes."""
    if ok is None:
        return None
    shape = getattr(ok, "shape", None)
    if shape is not None and tuple(shape) != ():
        try:
            what = summarize(tuple(shape), np.dtype(getattr(ok, "dtype", None)))
        except TypeError:
            what = f"an array of shape {tuple(shape)}"
        return f"returned {what}, not a truth value; reduce it, e.g. with .all()"
    try:
        passed = bool(ok)
    except Exception as e:  # noqa: BLE001 - an object with no truth value fails the check
        return f"returned a {type(ok).__name__} with no truth value ({type(e).__name__}: {e})"
    if passed:
        return None
    item = getattr(ok, "item", None)
    value = item() if shape is not None and callable(item) else ok
    return f"returned {value!r}"[:200]


def _check_name(fn: Callable[[Any], object], index: int) -> str:
    name = getattr(fn, "__name__", "")
    return f"check[{index}]" if not name or name == "<lambda>" else name


def spec_of_version(store: ArtifactStore, version: str) -> TreeSpec:
    """The stored spec of one version, from its header only."""
    return read_header(store.info(version).path).spec
