"""Tensors stored once per content (a store made with ``dedup=True``): a put
writes only the tensors the store does not hold, every load still checks
every byte, gc deletes a tensor only once no version refers to it, export
writes the one plain file, and versions put before dedup stay usable."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner

from treeguard import (
    ArtifactStore,
    IntegrityError,
    RetentionPolicy,
    load,
)
from treeguard._cli.main import main
from treeguard.provenance import generate_keys


def _tree(head: float = 0.0, n: int = 4) -> dict[str, Any]:
    return {
        "body": {f"l{i}": np.full((32, 8), i, np.float32) for i in range(n)},
        "head": np.full(8, head, np.float32),
    }


def _objects(root: Path) -> set[str]:
    return {p.name for p in (root / "tensors").iterdir() if not p.name.startswith(".")}


def _same(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_a_version_writes_only_the_tensors_the_store_lacks(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v1 = store.put(_tree(0.0))
    first = _objects(root)
    assert len(first) == 5  # four body tensors and the head
    v2 = store.put(_tree(1.0))  # one tensor changed
    added = _objects(root) - first
    assert len(added) == 1 and (root / "tensors" / added.pop()).stat().st_size == 8 * 4
    before = _objects(root)
    v3 = store.put(_tree(1.0))  # identical: a manifest only
    assert _objects(root) == before
    assert [store.info(v).kind for v in (v1, v2, v3)] == ["tensors"] * 3
    assert json.loads((root / "STORE.json").read_text())["dedup"] is True
    for v, head in ((v1, 0.0), (v2, 1.0), (v3, 1.0)):
        assert store.verify(v).status == "verified"
        assert _same(store.load_version(v, like=_tree()), _tree(head))
    store.promote(v2)
    assert _same(store.load_current(_tree()), _tree(1.0))
    assert store.load_current(subtree="['head']")[0] == 1.0  # a partial load


def test_the_digest_is_the_one_file_s_header_digest(tmp_path: Path) -> None:
    plain = ArtifactStore(tmp_path / "plain")
    dedup = ArtifactStore.init(tmp_path / "dedup", dedup=True)
    a, b = plain.put(_tree()), dedup.put(_tree())
    assert plain.verify(a).digest == dedup.verify(b).digest


def test_a_tampered_tensor_object_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v1 = store.put(_tree(0.0))
    assert store.verify(v1).status == "verified"
    store.promote(v1)
    v2 = store.put(_tree(2.0))  # head's object is v2's own
    (head,) = _objects(root) - {
        n for n in json.loads((root / "versions" / v1 / "tensors.json").read_text())["objects"]
    }
    target = root / "tensors" / head
    os.chmod(target, 0o644)
    target.write_bytes(np.full(8, 3.0, np.float32).tobytes())  # same size, other bytes
    with pytest.raises(IntegrityError) as e:
        store.load_version(v2)
    assert e.value.path == "['head']" and e.value.version == v2
    assert "head" in str(e.value) and "3.0" not in str(e.value)
    assert store.verify(v2).status == "rejected"  # the verdict says so; nothing is loaded
    shared = next(iter(_objects(root) - {head}))
    (root / "tensors" / shared).unlink()
    with pytest.raises(IntegrityError, match="is missing") as e:
        store.promote(v1)
    assert e.value.path is not None and e.value.path.startswith("['")
    assert store.current() == v1  # the pointer did not move, the refusal is typed


def test_a_truncated_or_extended_tensor_object_is_refused_naming_the_tensor(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v = store.put(_tree(5.0))
    head = _head_of(store, v, 0.0)
    target = root / "tensors" / head
    os.chmod(target, 0o644)
    whole = target.read_bytes()
    for changed in (whole[:-4], whole + b"\0" * 4):
        target.write_bytes(changed)
        with pytest.raises(IntegrityError) as e:
            store.load_version(v, like=_tree())
        assert e.value.path == "['head']" and e.value.version == v
        assert f"holds {len(changed)} bytes, not the 32 of f32[8]" in str(e.value)


def _head_of(store: ArtifactStore, version: str, other: float) -> str:
    """The object of ``version``'s head, which a version put now with a head
    of ``other`` does not share."""
    root = Path(store.root)
    (head,) = _objects_of(version, root) - _objects_of(store.put(_tree(other)), root)
    return head


def _objects_of(version: str, root: Path) -> set[str]:
    return set(json.loads((root / "versions" / version / "tensors.json").read_text())["objects"])


def test_gc_keeps_the_shared_tensors_and_removes_the_unshared(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    versions = [store.put(_tree(float(i))) for i in range(4)]
    assert len(_objects(root)) == 4 + 4  # the body once, four heads
    removed = store.gc(policy=RetentionPolicy(keep_last=1))
    assert removed == versions[:3]
    assert len(_objects(root)) == 4 + 1
    assert _same(store.load_version(versions[3], like=_tree()), _tree(3.0))
    assert sorted(p.name for p in (root / "doomed").iterdir()) != []
    assert store.history()[-2].action == "sweep"
    assert store.history()[-2].detail == {"tensors_removed": 3}
    # a head gc removed is written again by the next put that needs it
    v = store.put(_tree(0.0))
    assert _same(store.load_version(v, like=_tree()), _tree(0.0))


def test_gc_deletes_no_tensor_while_a_manifest_cannot_be_read(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v1, v2 = store.put(_tree(0.0)), store.put(_tree(1.0))
    (root / "versions" / v2 / "tensors.json").write_text("{")
    held = _objects(root)
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == [v1]
    assert _objects(root) == held  # v1's head is kept: v2's manifest does not read
    assert store.history()[-2].detail == {"tensors_kept": "a manifest could not be read"}


def _crashed_mid_put(root: Path, version: str, writer: str | None) -> None:
    """``version`` as a machine crash in its put may leave it: its record
    still ``writing``, its pid now another live process's (this one: a
    container's first process gets the same pid after a restart), its
    manifest renamed into place but empty (its bytes were never synced)."""
    record = root / "versions" / version / "status.json"
    doc = json.loads(record.read_text())
    doc.update(status="writing", pid=os.getpid())
    doc.pop("writer", None)
    record.write_text(json.dumps({**doc, **({"writer": writer} if writer else {})}))
    (root / "versions" / version / "tensors.json").write_bytes(b"")


def test_gc_takes_a_crashed_put_whose_pid_another_process_got_and_sweeps_again(
    tmp_path: Path,
) -> None:
    if not Path("/proc/sys/kernel/random/boot_id").exists():
        pytest.skip("needs Linux's /proc to tell a process from another with its pid")
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v1, v2, v3 = store.put(_tree(0.0)), store.put(_tree(1.0)), store.put(_tree(2.0))
    _crashed_mid_put(root, v3, writer="c3d4031f-another-boot:12345")
    held = _objects(root)
    assert sorted(store.gc(policy=RetentionPolicy(keep_last=1))) == [v1, v3]
    assert len(_objects(root)) == len(held) - 2  # v1's head and v3's: v2's five stay
    assert _same(store.load_version(v2, like=_tree()), _tree(1.0))


def test_gc_keeps_a_writing_version_whose_writer_may_still_run(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v1, _, v3 = store.put(_tree(0.0)), store.put(_tree(1.0)), store.put(_tree(2.0))
    record = json.loads((root / "versions" / v1 / "status.json").read_text())
    mine = record.get("writer")  # this process's mark, as its put recorded it (Linux)
    _crashed_mid_put(root, v3, writer=mine)  # the writer itself, or an older build's record
    held = _objects(root)
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == [v1]
    assert _objects(root) == held  # v3's manifest does not read: no tensor is deleted
    assert store.info(v3).status == "writing"


def test_a_changed_manifest_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore.init(root, dedup=True)
    v = store.put(_tree())
    assert store.verify(v).status == "verified"
    manifest = root / "versions" / v / "tensors.json"
    doc = json.loads(manifest.read_text())
    doc["header"] = doc["header"].replace("l0", "l9")  # renamed throughout
    manifest.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError):
        store.promote(v)
    with pytest.raises(IntegrityError, match=f"version {v}"):
        store.load_version(v)


def test_export_writes_the_one_plain_file(tmp_path: Path) -> None:
    key, _ = generate_keys(tmp_path / "ci", curve="P-256")
    store = ArtifactStore.init(tmp_path / "store", dedup=True, signing_key=key)
    store.put(_tree(0.0))
    v = store.put(_tree(5.0))
    assert store.verify(v).status == "verified"
    store.export(v, tmp_path / "out")
    exported = tmp_path / "out" / "model.safetensors"
    plain = safetensors.numpy.load_file(exported)  # any safetensors reader
    assert plain["['head']"][0] == 5.0 and len(plain) == 5
    assert _same(load(exported, like=_tree()), _tree(5.0))


def test_a_store_turned_dedup_keeps_its_file_versions_usable(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore(root)
    old = store.put(_tree(0.0))
    assert store.verify(old).status == "verified"
    store.promote(old)
    ArtifactStore.init(root, dedup=True)  # turns dedup on; the store is otherwise as it was
    new = store.put(_tree(1.0))
    assert (store.info(old).kind, store.info(new).kind) == ("file", "tensors")
    assert store.verify(new).status == "verified"
    store.promote(new)
    assert store.rollback() == old  # promotable: every byte re-read
    assert _same(store.load_current(_tree()), _tree(0.0))
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == []  # both are on the pointer


def test_store_init_dedup_on_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "store"
    done = CliRunner().invoke(main, ["store", "init", "--dedup", str(root)])
    assert done.exit_code == 0, done.output
    v = ArtifactStore(root).put(_tree())
    assert ArtifactStore(root).info(v).kind == "tensors"


def test_gc_clears_the_mark_of_a_tensor_a_version_names_so_puts_reuse_it(
    tmp_path: Path,
) -> None:
    store = ArtifactStore.init(tmp_path / "store", dedup=True)
    root, v1 = Path(store.root), store.put(_tree(0.0))
    head = _head_of(store, v1, 9.0)  # v1's head: a tensor no other version holds
    (root / "doomed" / head).write_bytes(b"")  # as a gc killed after its mark leaves it
    v3 = store.put(_tree(0.0))  # marked: not reused, written again under a fresh name
    (fresh,) = _objects_of(v3, root) - _objects_of(v1, root)
    assert fresh.startswith(head + ".")
    assert store.gc(policy=RetentionPolicy(keep_last=10)) == []
    assert not (root / "doomed" / head).exists()  # named by v1, kept: the mark is cleared
    before = _objects(root)
    v4 = store.put(_tree(0.0))
    assert _objects(root) == before and head in _objects_of(v4, root)
    for v in (v1, v3, v4):
        assert _same(store.load_version(v, like=_tree()), _tree(0.0))
