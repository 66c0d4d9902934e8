"""A put that the disk fails. A dedup store's: a directory whose sync
fails, a name refused while a leaf's write failed too, a temp that cannot
be removed after a failed sync; a file or sharded version's: a sync of its
reservation, its checkpoint or its record. Each is the ``StorageError``
that says what failed, naming the version, and the put leaves no version
behind."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.machine import cpu_mesh
from treeguard import ArtifactStore, StorageError, StoreError
from treeguard._src.store import space  # _src: a race no public call orders


def _tree() -> dict[str, Any]:
    return {"body": {"w": np.ones((16, 8), np.float32)}, "head": np.zeros(8, np.float32)}


def _store(root: Path) -> ArtifactStore:
    """A dedup store whose current version holds ``_tree()``."""
    store = ArtifactStore.init(root, dedup=True)
    store.promote(store.verify(store.put(_tree())).version)
    return store


def _fine_tune(store: ArtifactStore) -> dict[str, Any]:
    """A tree a verified load handed back, its head changed: the memo knows
    the rest, so the head's bytes are written while the name is reserved."""
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _tree())
    params = store.load_current(like)
    return {**params, "head": params["head"] + 1.0}


def _nothing_left(root: Path) -> None:
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified"]
    assert sorted(os.listdir(root / "versions")) == ["v000001"]
    assert not [n for n in os.listdir(root / "tensors") if n.startswith(".")]


def _synced(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


#: Which directory's fsync the disk fails (under the store's root), and
#: whether only once the candidate record is in it (the record's own sync).
_FAILS = {
    "root": ("", False),
    "versions": ("versions", False),
    "version": ("versions/v000002", False),
    "tensors": ("tensors", False),
    "record": ("versions/v000002", True),
}


@pytest.mark.parametrize("failing", list(_FAILS))
def test_a_directory_the_disk_fails_to_sync_is_a_storage_error_naming_it_and_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The disk failing a directory's fsync (an EIO: the entries made in it
    may not outlive a crash) fails the put before anything shows the
    version, or takes it back once its record is in: the error names the
    version and the directory, and nothing of the version is left (its
    log's line, if written, names a put that did not finish, as a crash
    leaves it). A file system without directory fsyncs (EINVAL) is no
    failure."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = _store(root)
    name, once_recorded = _FAILS[failing]
    directory = str(root / name)
    real = os.fsync
    code = [errno.EIO]

    def fsync(fd: int) -> None:
        record = Path(directory) / "status.json"
        if _synced(fd) == directory and (
            not once_recorded or json.loads(record.read_text())["status"] == "candidate"
        ):
            raise OSError(code[0], os.strerror(code[0]))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError) as e:
        store.put({**_tree(), "head": jnp.full((8,), 5.0)})
    assert e.value.version == "v000002"
    assert str(e.value).splitlines() == [
        f"{directory}: writing version v000002 failed: syncing it to the disk failed "
        "(Input/output error)",
        "hint: check the disk (the kernel's log says why it failed) and put it again; nothing "
        "of this version was kept",
    ]
    _nothing_left(root)
    code[0] = errno.EINVAL
    v = store.put({**_tree(), "head": jnp.full((8,), 6.0)})
    assert [i.status for i in store.versions()] == ["verified", "candidate"], v


def test_a_name_refused_beside_a_failed_leaf_is_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name refused for another reason than a full disk (the marker's
    write denied) is the error raised, not that of the leaf written
    meanwhile (denied too), which says nothing of why the name was not
    given."""
    root = tmp_path / "store"
    store = _store(root)
    tree = _fine_tune(store)
    real = os.open

    def denied(path: Any, *a: Any, **k: Any) -> int:
        name = os.path.basename(str(path))
        if name.startswith((".STORE.json.", ".staged.")):  # the marker's temp, the leaf's
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(StorageError) as e:
        store.put(tree)
    monkeypatch.undo()
    assert e.value.context == str(root / "STORE.json")
    assert "writing STORE.json failed: Permission denied" in str(e.value)
    _nothing_left(root)


def test_a_leaf_that_fills_the_disk_while_the_name_is_reserved_is_named() -> None:
    """A leaf's bytes written while the name is being reserved may fill the
    disk under the reservation too: the leaf's error then names the version
    the reservation picked, and the leaf; a name refused for another reason
    is that refusal, even one that names the version's directory."""
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(StorageError) as met, space.typed("/s/versions/v000002"):
        raise full
    picked = met.value

    def reservation_met_it_too() -> str:
        raise picked

    with pytest.raises(StorageError) as e, space.typed(reservation_met_it_too, "['extra']"):
        raise full
    assert str(e.value).splitlines()[0] == (
        "/s/versions/v000002: writing version v000002 failed at ['extra']: no space left on "
        "the device"
    )
    for refusal in (
        StoreError("version v000002 already exists", version="v000002"),
        StorageError(  # fields like a full disk's, and no full disk
            "writing version v000002 failed: its record was refused",
            version="v000002",
            context="/s/versions/v000002",
        ),
    ):

        def refused(refusal: StoreError = refusal) -> str:
            raise refusal

        with pytest.raises(StoreError) as got, space.typed(refused, "['extra']"):
            raise full
        assert got.value is refusal


def test_a_temp_that_cannot_be_removed_after_a_failed_sync_leaves_the_sync_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The candidate record's temp, removed when the reservation's
    directories' sync failed, may fail to go too: the error raised is still
    the sync's, which says what failed."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = _store(root)
    real_fsync, real_unlink = os.fsync, os.unlink

    def fsync(fd: int) -> None:
        if _synced(fd) == str(root):  # the marker's entry, synced with the record's temp
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    def unlink(path: Any, *a: Any, **k: Any) -> None:
        if os.path.basename(str(path)).startswith(".status.json.") and not k.get("dir_fd"):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        real_unlink(path, *a, **k)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(StorageError) as e:
        store.put({**_tree(), "head": jnp.full((8,), 5.0)})
    monkeypatch.undo()
    assert e.value.context == str(root)
    assert "syncing it to the disk failed (Input/output error)" in str(e.value)


def test_a_directory_that_cannot_be_opened_for_its_sync_fails_the_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No descriptor left to open a directory for its fsync: the sync did
    not happen, and the put does not report its version as written."""
    root = tmp_path / "store"
    store = _store(root)
    real = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECTORY and str(path).startswith(str(root / "versions")):
            monkeypatch.setattr(os, "open", real)  # once: the put's cleanup has its descriptors
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(StorageError, match=r"v000002 failed: syncing it to the disk failed \(Too"):
        store.put({**_tree(), "head": np.ones(8, np.float32)})
    _nothing_left(root)


def _failing_fsync(monkeypatch: pytest.MonkeyPatch, fails: Callable[[str], bool]) -> None:
    """Every fsync of a path ``fails`` picks is the disk's EIO."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if fails(_synced(fd)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _is_candidate(path: str) -> bool:
    """Whether ``path`` is a candidate record being written (its temp)."""
    return "status.json" in os.path.basename(path) and '"candidate"' in Path(path).read_text()


#: What the disk fails in a file version's put: the directory a reservation's
#: entry is in, the checkpoint's bytes (its temp, renamed once synced), the
#: candidate record's bytes; and the message's first line past the path.
_FILE_PUT = {
    "root": (lambda root, p: p == str(root), "syncing it to the disk failed (Input/output error)"),
    "versions": (
        lambda root, p: p == str(root / "versions"),
        "syncing it to the disk failed (Input/output error)",
    ),
    "version": (
        lambda root, p: p == str(root / "versions" / "v000002"),
        "syncing it to the disk failed (Input/output error)",
    ),
    "checkpoint": (lambda root, p: "model.safetensors" in p, "Input/output error"),
    "record": (lambda root, p: _is_candidate(p), "Input/output error"),
}


@pytest.mark.parametrize("failing", list(_FILE_PUT))
def test_a_file_version_s_put_the_disk_fails_is_a_storage_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A store without dedup: the disk failing a sync of the reservation's
    directories, of the checkpoint or of the candidate record is the
    ``StorageError`` naming the version and what failed (before, an
    ``OSError``: a bare ``[Errno 5] Input/output error`` for the files, and
    a reservation's failed sync left the version's directory behind)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = ArtifactStore.init(root)
    store.promote(store.verify(store.put(_tree())).version)
    fails, why = _FILE_PUT[failing]
    _failing_fsync(monkeypatch, lambda p: fails(root, p))
    with pytest.raises(StorageError) as e:
        store.put({**_tree(), "head": np.full(8, 5.0, np.float32)})
    assert e.value.version == "v000002"
    first = str(e.value).splitlines()[0]
    assert first.startswith(f"{root}") and first.endswith(
        f": writing version v000002 failed: {why}"
    )
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified"]
    assert sorted(os.listdir(root / "versions")) == ["v000001"]


def test_a_sharded_version_s_put_the_disk_fails_is_a_storage_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded version's candidate record whose sync the disk fails: the
    ``StorageError`` naming the version and the record, nothing left."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    mesh = cpu_mesh((2,), ("x",))
    placed = {"w": jax.device_put(np.arange(16.0, dtype=np.float32), NamedSharding(mesh, P("x")))}
    root = tmp_path / "store"
    store = ArtifactStore.init(root)
    _failing_fsync(monkeypatch, _is_candidate)
    with pytest.raises(StorageError) as e:
        store.put_sharded(placed)
    assert e.value.version == "v000001"
    assert str(e.value).splitlines()[0] == (
        f"{root}/versions/v000001/status.json: writing version v000001 failed: Input/output error"
    )
    assert os.listdir(root / "versions") == []


@pytest.mark.parametrize("failing", ["root", "versions", "version", "checkpoint", "record"])
def test_a_file_version_s_put_whose_sync_finds_the_disk_full_is_the_full_disk_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A sync the disk answers ``ENOSPC`` (NFS, a thin volume: the space is
    taken when the data is flushed), of the reservation's directories as
    of the files, is the full disk's error naming the version, as a dedup
    put's is (before, the reservation's was 'syncing it to the disk failed
    (No space left on device)', whose hint says to check the disk rather
    than to free space)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = ArtifactStore.init(root)
    store.promote(store.verify(store.put(_tree())).version)
    fails = _FILE_PUT[failing][0]
    real = os.fsync

    def fsync(fd: int) -> None:
        if fails(root, _synced(fd)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError) as e:
        store.put({**_tree(), "head": np.full(8, 5.0, np.float32)})
    assert e.value.version == "v000002"
    assert (
        str(e.value)
        .splitlines()[0]
        .endswith("writing version v000002 failed: no space left on the device")
    )
    assert "store.gc()" in (e.value.hint or "")
    assert [i.status for i in ArtifactStore(root).versions()] == ["verified"]
    assert sorted(os.listdir(root / "versions")) == ["v000001"]


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (errno.EROFS, "the file system is mounted read-only: remount it writable"),
        (errno.EACCES, "this user may not write there: check the store directory's permissions"),
    ],
)
def test_a_put_refused_by_the_file_system_says_what_to_mend_rather_than_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, fix: str
) -> None:
    """A checkpoint's write refused for another reason than a failing disk
    (a read-only mount, no permission) names that reason's fix, not the
    kernel's log."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name what each fsync syncs")
    root = tmp_path / "store"
    store = ArtifactStore.init(root)
    real = os.fsync

    def fsync(fd: int) -> None:
        if "model.safetensors" in _synced(fd):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError) as e:
        store.put(_tree())
    assert (
        str(e.value).splitlines()[1]
        == f"hint: {fix} and put it again; nothing of this version was kept"
    )
    assert os.listdir(root / "versions") == []
