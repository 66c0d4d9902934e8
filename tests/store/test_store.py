"""The artifact store: put, verify, promote, rollback, gc, history, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from corpus import seed_params

from treeguard import (
    ArtifactStore,
    DanglingPointerError,
    IntegrityError,
    RetentionPolicy,
    RetiredVersionError,
    StoreError,
    UnknownVersionError,
    read_header,
    spec_of,
)
from treeguard._cli.main import main

MODEL_FILE = "model.safetensors"
POINTER_FILE = "CURRENT.json"


def _params(scale: float = 1.0) -> dict[str, Any]:
    return {
        "dense1": {"w": np.full((2, 3), scale, np.float32), "b": np.zeros(3, np.float32)},
        "dense2": {"w": np.full((3, 1), scale, np.float32), "b": np.zeros(1, np.float32)},
    }


def _finite(tree: Any) -> bool:
    return all(bool(np.isfinite(np.asarray(x)).all()) for x in _leaves(tree))


def _leaves(tree: Any) -> list[Any]:
    import jax

    return jax.tree.leaves(tree)


def _verified(store: ArtifactStore, tree: Any, **kw: Any) -> str:
    v = store.put(tree, **kw)
    assert store.verify(v, checks=[_finite]).status == "verified"
    return v


def test_full_lifecycle(tmp_path: Path) -> None:
    store = ArtifactStore.init(tmp_path / "s")
    assert store.current() is None and store.versions() == []
    v1 = store.put(_params(1.0), metadata={"step": 100})
    assert v1 == "v000001" and store.info(v1).status == "candidate"
    with pytest.raises(StoreError, match="candidate, not verified"):
        store.promote(v1)
    info = store.verify(v1, checks=[_finite, ("positive", lambda t: t["dense1"]["w"].min() > 0)])
    assert info.status == "verified" and info.reason is None
    assert [c.name for c in info.checks] == ["integrity", "contract", "_finite", "positive"]
    store.promote(v1)
    assert store.current() == v1
    out = store.load_current(_params(0.0))
    assert out["dense1"]["w"][0, 0] == 1.0
    v2 = _verified(store, _params(2.0))
    store.promote(v2)
    assert store.current() == v2 and store.previous() == v1
    assert [e.action for e in store.history()] == [
        "init",
        "put",
        "verify",
        "promote",
        "put",
        "verify",
        "promote",
    ]
    assert store.info(v1).metadata == {"step": 100}


def test_status_files_are_readable_json(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = _verified(store, _params())
    store.promote(v)
    status = json.loads((tmp_path / "versions" / v / "status.json").read_text())
    assert status["status"] == "verified" and status["version"] == v
    assert status["verified_env"]["numpy"] == np.__version__
    pointer = json.loads((tmp_path / POINTER_FILE).read_text())
    assert pointer["current"] == v and pointer["previous"] == []
    assert (tmp_path / "versions" / v / "status.json").read_text().startswith("{\n  ")


def test_a_candidate_of_another_structure_is_rejected(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.promote(_verified(store, _params()))
    bad = store.put({**_params(), "dense3": {"w": np.ones(2, np.float32)}})
    info = store.verify(bad)
    assert info.status == "rejected"
    assert "['dense3']: unexpected" in (info.reason or "")
    assert "version v000001 (current)" in (info.reason or "")
    with pytest.raises(StoreError, match="rejected, not verified"):
        store.promote(bad)


def test_failing_and_raising_checks_reject_with_the_reason(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    nan = _params()
    nan["dense2"]["w"][0, 0] = np.nan
    v = store.put(nan)
    assert store.verify(v, checks=[_finite]).reason == "check _finite returned False"

    def loss_is_small(tree: Any) -> None:
        raise AssertionError("loss 7.3 > 1.0")

    info = store.verify(v, checks=[loss_is_small])
    assert info.status == "rejected"
    assert info.reason == "check loss_is_small raised AssertionError: loss 7.3 > 1.0"


def test_verify_against_like_and_spec(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(seed_params())
    assert store.verify(v, like=spec_of(seed_params())).status == "verified"
    info = store.verify(v, like={"dense1": {"w": jnp.ones((2, 3))}})
    assert info.status == "rejected" and "`like`" in (info.contract or "")


def test_rollback_after_a_rejected_candidate(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1 = _verified(store, _params(1.0))
    store.promote(v1)
    v2 = _verified(store, _params(2.0))
    store.promote(v2)
    bad = _params(3.0)
    bad["dense1"]["b"][:] = np.inf
    v3 = store.put(bad)
    assert store.verify(v3, checks=[_finite]).status == "rejected"
    with pytest.raises(StoreError):
        store.promote(v3)
    assert store.current() == v2
    assert store.rollback() == v1
    assert store.current() == v1
    assert store.load_current(_params(0.0))["dense1"]["w"][0, 0] == 1.0
    with pytest.raises(StoreError, match="no former version to roll back to"):
        store.rollback()
    actions = [(e.action, e.version) for e in store.history()]
    assert ("rollback", v1) in actions


def test_rollback_skips_versions_no_longer_verified(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1 = _verified(store, _params(1.0))
    store.promote(v1)
    v2 = _verified(store, _params(2.0))
    store.promote(v2)
    v3 = _verified(store, _params(3.0))
    store.promote(v3)
    # v2 turns out bad after the fact.
    assert store.verify(v2, checks=[lambda t: False]).status == "rejected"
    assert store.previous() == v1
    assert store.rollback() == v1


def test_gc_keeps_current_previous_and_newest(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1 = _verified(store, _params(1.0))
    store.promote(v1)
    v2 = _verified(store, _params(2.0))
    store.promote(v2)
    rejected = [store.put(_params(9.0)) for _ in range(3)]
    for v in rejected:
        store.verify(v, checks=[lambda t: False])
    newest = store.put(_params(4.0))
    removed = store.gc(policy=RetentionPolicy(keep_last=1))
    assert sorted(removed) == sorted(rejected)
    assert [v.version for v in store.versions()] == [v1, v2, newest]
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == [newest]
    assert [v.version for v in store.versions()] == [v1, v2]  # current and previous stay
    assert store.load_current(_params())["dense2"]["w"][0, 0] == 2.0
    assert store.history()[-1].action == "gc"
    with pytest.raises(ValueError, match="keep"):
        store.gc(policy=RetentionPolicy(keep_last=-1))
    for grace in (-1.0, float("nan"), True, "3600"):
        with pytest.raises(ValueError, match="orphan_grace_s must be 0 or more seconds"):
            RetentionPolicy(orphan_grace_s=grace)  # type: ignore[arg-type]


def test_gc_removes_dead_writers_and_reserved_dirs(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    status_path = tmp_path / "versions" / v / "status.json"
    status = json.loads(status_path.read_text())
    status.update(status="writing", pid=2**22 + 12345)  # no such process
    status_path.write_text(json.dumps(status))
    (tmp_path / "versions" / "v000007").mkdir()  # reserved, never written
    assert sorted(store.gc(policy=RetentionPolicy(keep_last=5))) == [v, "v000007"]
    assert not any(p.name.startswith(".trash") for p in (tmp_path / "versions").iterdir())


@pytest.mark.parametrize(
    "name", ["../outside", "..", ".", "a/b", "/etc", "", "x" * 200, ".hidden", "v1/../../x"]
)
def test_version_names_cannot_escape_the_root(tmp_path: Path, name: str) -> None:
    store = ArtifactStore(tmp_path / "s")
    with pytest.raises(UnknownVersionError, match="not a version name"):
        store.put(_params(), version=name)
    for op in (store.promote, store.info, lambda n: store.verify(n)):
        with pytest.raises(UnknownVersionError):
            op(name)
    assert os.listdir(tmp_path) == []  # nothing was created


def test_named_versions_and_duplicates(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    assert store.put(_params(), version="release-1.0") == "release-1.0"
    with pytest.raises(StoreError, match="already exists"):
        store.put(_params(), version="release-1.0")
    with pytest.raises(UnknownVersionError, match="no version nope"):
        store.promote("nope")


def test_symlinked_version_is_refused(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v = store.put(_params())
    os.symlink(tmp_path / "s" / "versions" / v, tmp_path / "s" / "versions" / "evil")
    with pytest.raises(UnknownVersionError, match="symbolic link"):
        store.info("evil")
    assert [i.version for i in store.versions()] == [v]


def test_promote_refuses_a_file_changed_after_verify(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = _verified(store, _params())
    other = store.put(_params(5.0))
    os.replace(store.info(other).path, store.info(v).path)
    with pytest.raises(
        IntegrityError, match="version v000001: its checkpoint changed since it was verified"
    ):
        store.promote(v)


def test_load_current_detects_corruption_and_can_fall_back(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1 = _verified(store, _params(1.0))
    store.promote(v1)
    v2 = _verified(store, _params(2.0))
    store.promote(v2)
    path = Path(store.info(v2).path)
    h = read_header(path)
    with open(path, "r+b") as f:
        f.seek(h.data_start + 3)
        f.write(b"\xff")
    with pytest.raises(IntegrityError):
        store.load_current(_params())
    out = store.load_current(_params(), fallback=True)
    assert out["dense1"]["w"][0, 0] == 1.0
    assert store.history()[-1].action == "fallback"
    assert store.verify(v2).status == "rejected"


def test_load_current_before_any_promotion(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no current version"):
        ArtifactStore.init(tmp_path).load_current()


def test_corrupt_pointer_is_reported(tmp_path: Path) -> None:
    store = ArtifactStore.init(tmp_path)
    (tmp_path / POINTER_FILE).write_text("{not json")
    with pytest.raises(StoreError, match="pointer is damaged: the pointer is not valid JSON"):
        store.current()


def test_model_file_is_a_checkpoint(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params(), metadata={"run": "a"})
    h = read_header(tmp_path / "versions" / v / MODEL_FILE)
    assert h.metadata == {"run": "a"} and h.spec == spec_of(_params())


def test_gc_with_keep_larger_than_the_count_removes_nothing(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1, v2 = store.put(_params(1.0)), store.put(_params(2.0))
    assert store.gc(policy=RetentionPolicy(keep_last=3)) == []
    assert [v.version for v in store.versions()] == [v1, v2]
    assert store.gc(policy=RetentionPolicy(keep_last=2)) == []
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == [v1]


@pytest.mark.parametrize(
    "check",
    [
        lambda t: np.isfinite(t["dense2"]["w"]).all(),  # np.False_
        lambda t: jnp.isfinite(t["dense2"]["w"]).all(),  # a 0-d jax bool array
    ],
    ids=["numpy_bool", "jax_bool"],
)
def test_a_falsy_check_result_rejects(tmp_path: Path, check: Any) -> None:
    store = ArtifactStore(tmp_path)
    nan = _params()
    nan["dense2"]["w"][0, 0] = np.nan
    v = store.put(nan)
    info = store.verify(v, checks=[("finite", check)])
    assert info.status == "rejected"
    assert info.reason is not None and info.reason.startswith("check finite returned")
    assert [c.ok for c in info.checks] == [True, True, False]
    assert store.verify(store.put(_params()), checks=[("finite", check)]).status == "verified"
    assert store.verify(v, checks=[("zero", lambda t: 0)]).reason == "check zero returned 0"


def test_a_check_returning_an_array_is_rejected_with_a_reason(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    info = store.verify(v, checks=[("elementwise", lambda t: np.isfinite(t["dense1"]["w"]))])
    assert info.status == "rejected"
    assert info.reason == (
        "check elementwise returned bool[2,3], not a truth value; reduce it, e.g. with .all()"
    )
    info = store.verify(v, checks=[("jax", lambda t: jnp.isfinite(t["dense1"]["w"]))])
    assert info.status == "rejected" and "returned bool[2,3], not a truth value" in (
        info.reason or ""
    )


def test_promote_rehashes_every_tensor(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = _verified(store, _params())
    path = Path(store.info(v).path)
    h = read_header(path)
    t = next(t for t in h.tensors if t.name == "['dense2']['w']")
    with open(path, "r+b") as f:
        f.seek(h.data_start + t.begin + 2)
        f.write(b"\x7f")
    with pytest.raises(IntegrityError, match=r"\['dense2'\]\['w'\]: f32\[3,1\]: blake3") as info:
        store.promote(v)
    assert f"version {v}: its checkpoint changed since it was verified" in str(info.value)
    assert isinstance(info.value.__cause__, IntegrityError)
    assert store.current() is None


def test_put_with_bad_metadata_leaves_nothing(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    with pytest.raises(TypeError, match=r"metadata\['opt'\]\['lr'\]: .*object") as info:
        store.put(_params(), metadata={"step": 1, "opt": {"lr": object()}})
    assert "hint:" in str(info.value)
    with pytest.raises(TypeError, match=r"metadata\['loss'\]: .*nan"):
        store.put(_params(), metadata={"loss": float("nan")})
    assert os.listdir(tmp_path) == []  # nothing created, not even the store
    assert store.put(_params()) == "v000001"


def test_a_failed_save_in_put_removes_the_version_dir_and_burns_its_name(tmp_path: Path) -> None:
    from treeguard import InvalidTreeError

    store = ArtifactStore(tmp_path)
    with pytest.raises(InvalidTreeError):
        store.put({"w": np.ones(2, np.float32), "s": "not an array"})
    assert os.listdir(tmp_path / "versions") == []
    assert store.put(_params()) == "v000002"  # a name is never handed out twice


@pytest.mark.parametrize("dedup", [False, True], ids=["file", "tensors"])
def test_an_auto_named_put_passes_over_a_name_something_else_holds(
    tmp_path: Path, dedup: bool
) -> None:
    store = ArtifactStore.init(tmp_path, dedup=dedup)
    assert store.put(_params()) == "v000001"
    (tmp_path / "versions" / "v000002").write_bytes(b"")  # not a version, but the name is held
    (tmp_path / "versions" / "v000003").symlink_to(tmp_path)
    assert store.put(_params()) == "v000004"
    assert [i.version for i in store.versions()] == ["v000001", "v000004"]


def test_verify_refuses_a_version_still_being_written(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    status_path = tmp_path / "versions" / v / "status.json"
    status = json.loads(status_path.read_text())
    status.update(status="writing", pid=os.getpid())
    status_path.write_text(json.dumps(status))
    with pytest.raises(StoreError, match=f"version {v} is still being written"):
        store.verify(v)
    assert store.info(v).status == "writing"
    assert [e.action for e in store.history()] == ["put"]


@pytest.mark.parametrize(
    "bad",
    [
        {"checks": [{"name": "x", "ok": True, "surprise": 1}]},
        {"checks": [{"name": "x"}]},
        {"checks": "nope"},
        {"checks": [{"name": 3, "ok": True}]},
        {"metadata": [1, 2]},
        {"num_params": "12"},
        {"reason": 5},
    ],
    ids=["extra_field", "missing_field", "not_a_list", "bad_name", "metadata", "count", "reason"],
)
def test_a_malformed_status_file_is_a_store_error(tmp_path: Path, bad: dict[str, Any]) -> None:
    store = ArtifactStore(tmp_path)
    good = store.put(_params())
    v = store.put(_params())
    status_path = tmp_path / "versions" / v / "status.json"
    status = json.loads(status_path.read_text())
    status.update(bad)
    status_path.write_text(json.dumps(status))
    with pytest.raises(StoreError, match="status.json is malformed") as info:
        store.info(v)
    assert str(status_path) in str(info.value)
    listed = store.versions()
    assert [(i.version, i.status) for i in listed] == [(good, "candidate"), (v, "unreadable")]
    assert str(status_path) in (listed[1].reason or "")
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == [
        good
    ]  # an unreadable version is never deleted
    assert [i.version for i in store.versions()] == [v]


def test_load_current_takes_like_by_keyword(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.promote(_verified(store, _params(3.0)))
    out = store.load_current(like=_params(0.0), fallback=True)
    assert out["dense1"]["w"][0, 0] == 3.0
    assert store.load_current(_params(0.0))["dense1"]["w"][0, 0] == 3.0


def _pointing_at(root: Path, current: str, previous: list[str]) -> None:
    """CURRENT.json edited by hand (or left by an older gc) to name ``current``."""
    data = json.loads((root / POINTER_FILE).read_text())
    (root / POINTER_FILE).write_text(json.dumps({**data, "current": current, "previous": previous}))


def test_gc_stops_on_a_pointer_naming_an_absent_version_and_repair_fixes_it(
    tmp_path: Path,
) -> None:
    store = ArtifactStore.init(tmp_path)
    v1, v2 = _verified(store, _params(1.0)), _verified(store, _params(2.0))
    store.promote(v1)
    store.promote(v2)
    _pointing_at(tmp_path, "v000009", [v1])  # v2 is the real current one
    with pytest.raises(DanglingPointerError, match="names version v000009 as current") as e:
        store.gc(policy=RetentionPolicy(keep_last=0))
    assert e.value.version == "v000009" and "store repair" in str(e.value)
    assert [v.version for v in store.versions()] == [v1, v2]  # nothing deleted
    done = CliRunner().invoke(main, ["store", "repair", str(tmp_path), v2])
    assert done.exit_code == 0, done.output
    assert "dropped from the pointer: v000009" in done.output
    assert (store.current(), store.previous()) == (v2, v1)
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == []
    assert store.history()[-1].action == "repair"


def test_repair_refuses_a_version_that_fails_the_gates(tmp_path: Path) -> None:
    store = ArtifactStore.init(tmp_path)
    v1 = store.put(_params(1.0))
    with pytest.raises(StoreError, match="candidate, not verified"):
        store.repair(v1)
    done = CliRunner().invoke(main, ["store", "repair", str(tmp_path), "v000042"])
    assert done.exit_code == 2 and "no version v000042" in done.output


def test_promote_and_rollback_refuse_a_retired_name(tmp_path: Path) -> None:
    store = ArtifactStore.init(tmp_path)
    v1, v2 = _verified(store, _params(1.0)), _verified(store, _params(2.0))
    store.promote(v1)
    store.promote(v2)
    marker = json.loads((tmp_path / "STORE.json").read_text())
    # what a gc killed between retiring v1's name and deleting its directory leaves
    (tmp_path / "STORE.json").write_text(json.dumps({**marker, "retired": [v1]}))
    with pytest.raises(RetiredVersionError, match=f"version {v1} was removed by gc"):
        store.promote(v1)
    with pytest.raises(StoreError, match=f"skipped {v1}: .*version {v1} was removed by gc"):
        store.rollback()
    assert store.current() == v2
