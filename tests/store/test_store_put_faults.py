"""A dedup store's put that the disk fails: a directory whose sync fails, a
temp that cannot be removed after a failed sync. Each is the
``StorageError`` that says what failed, naming the version, and the put
leaves no version behind."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from treeguard import ArtifactStore, StorageError


def _tree() -> dict[str, Any]:
    return {"body": {"w": np.ones((16, 8), np.float32)}, "head": np.zeros(8, np.float32)}


def _store(root: Path) -> ArtifactStore:
    """A dedup store whose current version holds ``_tree()``."""
    store = ArtifactStore.init(root, dedup=True)
    store.promote(store.verify(store.put(_tree())).version)
    return store


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
