"""The local store against the attacks and faults that used to get through:
a link swapped into gc's path, gc killed mid-removal, a signed store opened
without its key, a first promote killed half-way, unsafe key files, a clock
that steps back, verify racing gc, and two promoters racing (on a disk; in a
bucket, tests/store/test_store_bucket.py races them). Each test shows the
refusal (or the recovery) and then the invariant. A race is made by what the
other party leaves on disk, at the moment a standard-library call marks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import treeguard as tg
from tests.machine import needs_inet_sockets
from tests.store.storm import storm
from tests.subproc import run_on_a_small_disk, run_python
from treeguard import ArtifactStore, ConfigError, RetentionPolicy, StoreError, UnknownVersionError

KEY = b"k" * 32


def _params(scale: float = 1.0) -> dict[str, Any]:
    return {"w": np.full((2, 3), scale, np.float32), "b": np.zeros(3, np.float32)}


def _verified(store: ArtifactStore, scale: float) -> str:
    v = store.put(_params(scale))
    assert store.verify(v).status == "verified"
    return v


def test_gc_never_deletes_through_a_link_swapped_in_while_it_reads_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = ArtifactStore(tmp_path / "victim")
    theirs = _verified(victim, 5.0)
    victim.promote(theirs)
    victim_model = tmp_path / "victim" / "versions" / theirs / "model.safetensors"
    store = ArtifactStore(tmp_path / "a")
    old = store.put(_params(1.0))
    for scale in (2.0, 3.0, 4.0):
        store.put(_params(scale))
    versions = tmp_path / "a" / "versions"
    old_inode = (versions / old).stat().st_ino
    real_stat = os.stat

    def swap_then_stat(path: Any, *args: Any, dir_fd: int | None = None, **kw: Any) -> Any:
        # as gc looks at the record to decide, through the directory it holds
        # open (after the listing), the version's directory becomes a link to
        # the other store's promoted version
        if (
            path == "status.json"
            and dir_fd is not None
            and not (versions / old).is_symlink()
            and os.fstat(dir_fd).st_ino == old_inode
        ):
            (versions / old).rename(versions / ".moved")
            (versions / old).symlink_to(tmp_path / "victim" / "versions" / theirs)
        return real_stat(path, *args, dir_fd=dir_fd, **kw)

    monkeypatch.setattr(os, "stat", swap_then_stat)
    store.gc(policy=RetentionPolicy(keep_last=3))
    monkeypatch.undo()
    assert (versions / ".moved").is_dir()  # the swap happened while gc held the directory
    assert victim_model.is_file()
    assert victim.load_current(_params())["w"][0, 0] == 5.0
    assert not (versions / old).exists()  # the link is gone, unfollowed


_KILL_GC = """
import os, signal, sys
from treeguard import ArtifactStore, RetentionPolicy

unlink = os.unlink

def die(*args, **kwargs):
    if "dir_fd" not in kwargs:
        return unlink(*args, **kwargs)  # a temporary file of the marker or the pointer
    os.kill(os.getpid(), signal.SIGKILL)

store = ArtifactStore(sys.argv[1])
os.unlink = die  # killed at gc's first unlink of a version's files
store.gc(policy=RetentionPolicy(keep_last=1))
"""


def test_a_name_is_retired_before_gc_deletes_anything_of_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    first = store.put(_params(1.0), version="release-1")
    store.put(_params(2.0))
    done = run_python(_KILL_GC, str(tmp_path))
    assert done.returncode == -signal.SIGKILL, done.stderr
    with pytest.raises(StoreError, match="version release-1 existed and was removed by gc"):
        store.put(_params(3.0), version=first)
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == []
    assert not any(n.startswith(".trash-") for n in os.listdir(tmp_path / "versions"))


def test_a_first_promote_killed_after_its_marker_leaves_a_store_that_works(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path)
    v = _verified(store, 1.0)
    # what an older treeguard left when killed between the marker and the pointer
    marker = json.loads((tmp_path / "STORE.json").read_text())
    (tmp_path / "STORE.json").write_text(json.dumps({**marker, "promoted": True}))
    assert store.current() is None
    assert store.gc() == []
    store.promote(v)
    assert store.current() == v and store.load_current(_params())["w"][0, 0] == 1.0
    (tmp_path / "CURRENT.json").unlink()  # a pointer lost after a logged promote: damaged
    with pytest.raises(StoreError, match="the pointer is damaged: it is missing"):
        store.current()


def test_a_key_file_others_may_rewrite_or_inside_the_store_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o666)
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", str(key_file))
    with pytest.raises(StoreError, match=r"the key file is writable by others \(mode 0666\)"):
        ArtifactStore(tmp_path / "s")
    key_file.chmod(0o600)
    assert ArtifactStore(tmp_path / "s").signed
    inside = tmp_path / "s" / "key"
    inside.parent.mkdir()
    inside.write_bytes(KEY)
    inside.chmod(0o600)
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", str(inside))
    with pytest.raises(StoreError, match="the key file lies inside the store's directory") as e:
        ArtifactStore(tmp_path / "s")
    assert str(inside) in str(e.value)
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", "")
    with pytest.raises(ConfigError, match="TREEGUARD_STORE_KEY_FILE is set but empty"):
        ArtifactStore(tmp_path / "s")


def test_a_key_file_larger_than_a_key_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"x" * 8192)
    key_file.chmod(0o600)
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", str(key_file))
    with pytest.raises(
        StoreError, match=r"the key file is \d+ bytes, more than the 4096 allowed"
    ) as e:
        ArtifactStore(tmp_path / "s")
    assert "checkpoint" not in str(e.value) and "treeguard wrote" not in str(e.value)


def test_gc_keeps_the_newest_puts_after_the_clock_stepped_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    a = store.put(_params(1.0), version="a")
    b = store.put(_params(2.0), version="b")
    c = store.put(_params(3.0), version="c")
    # the clock stepped back by a minute at every put, as each record says
    for minute, version in zip((59, 58, 57), (a, b, c), strict=True):
        status = tmp_path / "versions" / version / "status.json"
        record = json.loads(status.read_text())
        status.write_text(json.dumps(record | {"created": f"2026-01-01T00:{minute}:00.000+00:00"}))
    assert [v.version for v in store.versions()] == [a, b, c]
    assert store.gc(policy=RetentionPolicy(keep_last=2)) == [a]


def test_verify_racing_gc_that_removed_the_version_is_an_unknown_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params(1.0))
    version_dir = tmp_path / "versions" / v
    real_lexists = os.path.lexists

    def removed_then_looked_at(path: Any) -> bool:
        # gc takes the version right after verify read its record, as verify
        # looks at what its directory holds
        if os.path.dirname(path) == str(version_dir) and version_dir.is_dir():
            shutil.rmtree(version_dir)
        return real_lexists(path)

    monkeypatch.setattr(os.path, "lexists", removed_then_looked_at)
    with pytest.raises(UnknownVersionError, match=f"version {v} was removed while it was verified"):
        store.verify(v)


@pytest.mark.parametrize("first", [True, False], ids=["first-promote", "later-promote"])
def test_two_promoters_one_wins_and_the_other_hears_who(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: bool
) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root)
    v1, v2, v3 = _verified(store, 1.0), _verified(store, 2.0), _verified(store, 3.0)
    if not first:
        store.promote(v1)
    # the pointer another process's promote of v2 writes, made in a copy of the store as it is
    shutil.copytree(root, tmp_path / "copy")
    ArtifactStore(tmp_path / "copy").promote(v2)
    theirs = (tmp_path / "copy" / "CURRENT.json").read_bytes()
    real_open, moments = os.open, []

    def moved_after_ours_was_read(path: Any, *args: Any, **kw: Any) -> int:
        # the other process moves the pointer once ours has read it (at the look
        # at the marker that follows), before ours writes
        name = os.path.basename(path)
        if name == "CURRENT.json" and not moments:
            moments.append("ours read")
        elif name == "STORE.json" and moments == ["ours read"]:
            (tmp_path / "theirs").write_bytes(theirs)
            os.replace(tmp_path / "theirs", root / "CURRENT.json")
            moments.append("theirs written")
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", moved_after_ours_was_read)
    with pytest.raises(tg.ConflictError, match=f"version {v2} is current") as e:
        store.promote(v3)
    monkeypatch.undo()
    assert moments == ["ours read", "theirs written"]
    assert e.value.version == v2 and store.current() == v2
    assert [e.action for e in store.history()].count("promote") == (0 if first else 1)


_FILL_DISK = """
import os, sys
import jax.numpy as jnp
from treeguard import ArtifactStore, StorageError
store = ArtifactStore(sys.argv[1])
for put in (store.put, store.put_sharded):
    try:
        put({"w": jnp.ones((1024, 1024))}, version=put.__name__)
    except StorageError as e:
        print(type(e).__name__, e.version, str(e).splitlines()[0].split(": ", 1)[1])
print(sorted(os.listdir(os.path.join(sys.argv[1], "versions"))))
"""


@pytest.mark.slow
def test_a_full_disk_during_put_is_a_storage_error_naming_the_version(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    done = run_on_a_small_disk(_FILL_DISK, disk, "size=1m", f"{disk}/store")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "StorageError put writing version put failed: no space left on the device",
        "StorageError put_sharded writing version put_sharded failed: no space left on the device",
        "[]",
    ]


_FULL_BEFORE_THE_NAME = """
import os, sys
import numpy as np
from treeguard import ArtifactStore, StorageError
stores = [ArtifactStore.init(os.path.join(sys.argv[1], k), dedup=k == "dedup") for k in ("plain", "dedup")]
fd = os.open(os.path.join(sys.argv[1], "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError:
    pass
for store in stores:
    try:
        store.put({"w": np.ones(4, np.float32)})
    except StorageError as e:
        print(type(e).__name__, e.version, str(e).splitlines()[0].split(": ", 1)[1])
    print(sorted(os.listdir(os.path.join(store.root, "versions"))))
"""


@pytest.mark.slow
def test_a_disk_full_before_the_name_is_reserved_is_a_storage_error_naming_it(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    done = run_on_a_small_disk(_FULL_BEFORE_THE_NAME, disk, "size=256k", str(disk))
    assert done.returncode == 0, done.stderr[-2000:]
    said = "StorageError v000001 writing version v000001 failed: no space left on the device"
    assert done.stdout.splitlines() == [said, "[]", said, "[]"]


def test_a_bucket_url_is_never_taken_for_a_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("s3://models/mlp", "gs://models"):
        assert ArtifactStore(url).root == url
        assert ArtifactStore(Path(url)).root == url  # a Path of a URL collapses its // to /
    needs_inet_sockets()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_python(
        "from treeguard._cli.main import main; main()",
        "store",
        "init",
        "s3://models/mlp",
        cwd=tmp_path,
        env={
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "never-shown",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        },
    )
    assert done.returncode == 2, done.stderr
    assert "reading STORE.json failed: the connection failed" in done.stderr
    assert "never-shown" not in done.stderr
    assert os.listdir(tmp_path) == []


def _consistent(root: Path) -> None:
    """What a kill at any moment must leave: a store every operation reads."""
    store = ArtifactStore(root)
    listed = store.versions()
    assert not [v for v in listed if v.status == "unreadable"], listed
    names = [v.version for v in listed]
    assert len(names) == len(set(names))
    retired = set(json.loads((root / "STORE.json").read_text())["retired"])
    assert not retired & {v.version for v in listed if v.status != "writing"}
    current = store.current()
    if current is not None:
        assert store.load_current()["w"].shape == (64, 64)
    store.gc(policy=RetentionPolicy(keep_last=2))
    assert store.current() == current


@pytest.mark.reliability
def test_a_writer_killed_at_random_moments_leaves_a_consistent_store(tmp_path: Path) -> None:
    ArtifactStore.init(tmp_path)
    assert storm(str(tmp_path), lambda _printed: _consistent(tmp_path)) >= 30


def test_gc_unlinks_a_trash_link_and_keeps_a_trash_directory_with_foreign_files(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "model.safetensors").write_bytes(b"theirs")
    store = ArtifactStore(tmp_path / "s")
    store.put(_params(1.0))
    versions = tmp_path / "s" / "versions"
    (versions / ".trash-v000009-0123abcd").symlink_to(victim)
    foreign = versions / ".trash-v000008-0123abcd"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not the store's")
    store.gc()
    assert (victim / "model.safetensors").read_bytes() == b"theirs"
    assert not (versions / ".trash-v000009-0123abcd").is_symlink()
    assert (foreign / "notes.txt").is_file()


def test_a_gc_killed_between_retiring_a_name_and_deleting_it_leaves_no_version(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path)
    names = [store.put(_params(float(i))) for i in range(3)]
    store.verify(names[2])
    store.promote(names[2])
    # what such a kill leaves: the name retired in STORE.json, its directory whole
    marker = json.loads((tmp_path / "STORE.json").read_text())
    marker["retired"] = [names[0]]
    (tmp_path / "STORE.json").write_text(json.dumps(marker))
    assert [v.version for v in store.versions()] == names[1:]
    with pytest.raises(UnknownVersionError, match="removed by gc"):
        store.load_version(names[0])
    assert (tmp_path / "versions" / names[0]).is_dir()
    store.gc(policy=RetentionPolicy(keep_last=5))  # the next gc finishes the removal
    assert not (tmp_path / "versions" / names[0]).exists()
    assert [v.version for v in store.versions()] == names[1:]
    assert store.current() == names[2]
