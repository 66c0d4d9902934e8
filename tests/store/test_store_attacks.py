"""The local store against the attacks and faults that used to get through:
a link swapped into gc's path, gc killed mid-removal, a signed store opened
without its key, a first promote killed half-way, unsafe key files, a clock
that steps back, verify racing gc, and two promoters racing (on a disk and
in a bucket). Each test shows the refusal (or the
recovery) and then the invariant."""

from __future__ import annotations

import itertools
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
from treeguard._src.store import pointer, records  # _src: pointer and records raced and forged

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
    real_read = records.read
    reads = []

    def swap_then_read(version_dir: str, **kw: Any) -> dict[str, Any]:
        # while gc parses the record to decide (its second read, after the
        # listing), the version's directory becomes a link to the other
        # store's promoted version
        if os.path.basename(version_dir) == old:
            reads.append(version_dir)
        if len(reads) == 2 and not (versions / old).is_symlink():
            (versions / old).rename(versions / ".moved")
            (versions / old).symlink_to(tmp_path / "victim" / "versions" / theirs)
        return real_read(version_dir, **kw)

    monkeypatch.setattr(records, "read", swap_then_read)
    store.gc(policy=RetentionPolicy(keep_last=3))
    monkeypatch.undo()
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
    ticks = itertools.count()
    # the clock steps back by a minute at every look
    monkeypatch.setattr(
        records, "now", lambda: f"2026-01-01T00:{59 - next(ticks):02d}:00.000+00:00"
    )
    a = store.put(_params(1.0), version="a")
    b = store.put(_params(2.0), version="b")
    c = store.put(_params(3.0), version="c")
    assert [v.version for v in store.versions()] == [a, b, c]
    assert store.gc(policy=RetentionPolicy(keep_last=2)) == [a]


def test_verify_racing_gc_that_removed_the_version_is_an_unknown_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params(1.0))
    real_read = records.read

    def read_then_removed(version_dir: str, **kw: Any) -> dict[str, Any]:
        data = real_read(version_dir, **kw)
        shutil.rmtree(version_dir)  # gc takes it right after verify read its record
        return data

    monkeypatch.setattr(records, "read", read_then_removed)
    with pytest.raises(UnknownVersionError, match=f"version {v} was removed while it was verified"):
        store.verify(v)


S3 = (pytest.mark.slow, pytest.mark.xdist_group("s3"))  # the session's SeaweedFS server


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=S3)])
@pytest.mark.parametrize("first", [True, False], ids=["first-promote", "later-promote"])
def test_two_promoters_one_wins_and_the_other_hears_who(
    tmp_path: Path, request: pytest.FixtureRequest, where: str, first: bool
) -> None:
    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3_url")
    store = ArtifactStore.init(root)
    other = ArtifactStore(root)  # another process's view of the same store
    v1, v2 = _verified(store, 1.0), _verified(store, 2.0)
    if not first:
        store.promote(v1)

    storage = store._backend.storage
    seen = pointer.read(storage, promoted=not first)  # the race's first read
    assert seen.tag is None if first else seen.tag is not None
    other.promote(v2)  # another process moves the pointer after ours was read
    with pytest.raises(tg.ConflictError, match=f"version {v2} is current") as e:
        pointer.write(storage, pointer.Pointer(v1, ()), replacing=seen)
    assert e.value.version == v2 and store.current() == v2 == other.current()


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
