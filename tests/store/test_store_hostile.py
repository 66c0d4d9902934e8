"""The store under attack: links, FIFOs, edited records, swapped files, forged
verdicts, races and crashes. Each test shows one refusal and then checks the
invariant: what was verified still loads and matches its digest, and nothing
outside the store changed."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import treeguard as tg
from treeguard import (
    ArtifactStore,
    IntegrityError,
    RetentionPolicy,
    SignatureError,
    StoreError,
)
from treeguard._cli.main import main

KEY = b"k" * 32


def _params(scale: float = 1.0) -> dict[str, Any]:
    return {"w": np.full((2, 3), scale, np.float32), "b": np.zeros(3, np.float32)}


def _finite(tree: Any) -> bool:
    return bool(np.isfinite(tree["w"]).all())


def _verified(store: ArtifactStore, scale: float) -> str:
    v = store.put(_params(scale))
    assert store.verify(v, checks=[_finite]).status == "verified"
    return v


def _promoted_pair(root: Path, **kw: Any) -> tuple[ArtifactStore, str, str]:
    store = ArtifactStore(root, **kw)
    v1 = _verified(store, 1.0)
    store.promote(v1)
    v2 = _verified(store, 2.0)
    store.promote(v2)
    return store, v1, v2


def _model(root: Path, version: str) -> Path:
    return root / "versions" / version / "model.safetensors"


def _status(root: Path, version: str) -> Path:
    return root / "versions" / version / "status.json"


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` in a thread; fails the test if it blocks (a FIFO opened for reading)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _snapshot(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


# -- 1. nothing outside the store is touched ------------------------------


def test_gc_refuses_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "versions" / "photos").mkdir(parents=True)
    (tmp_path / "versions" / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "versions" / "v000001").mkdir()
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError, match=r"not a treeguard store \(no STORE.json\)"):
        ArtifactStore(tmp_path).gc()
    with pytest.raises(StoreError, match="not a treeguard store"):
        ArtifactStore(tmp_path).put(_params())  # a directory with content is not adopted silently
    assert _snapshot(tmp_path) == before and (tmp_path / "versions" / "v000001").is_dir()


def test_a_symlinked_versions_dir_is_never_followed(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store = ArtifactStore(root)
    store.put(_params())
    (elsewhere / "v000009").mkdir(parents=True)
    (elsewhere / "v000009" / "model.safetensors").write_bytes(b"precious")
    (elsewhere / "v000009" / "status.json").write_text('{"status": "rejected"}')
    (root / "versions").rename(tmp_path / "moved")
    (root / "versions").symlink_to(elsewhere)
    before = _snapshot(elsewhere)
    for op in (
        store.gc,
        store.versions,
        lambda: store.put(_params()),
        lambda: store.info("v000009"),
    ):
        with pytest.raises(StoreError, match="versions is a symbolic link, not a directory"):
            op()
    assert _snapshot(elsewhere) == before


def test_read_only_commands_create_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no-store"
    store = ArtifactStore(missing)
    for op in (store.current, store.versions, store.history, store.load_current):
        with pytest.raises(StoreError, match="the store root does not exist"):
            op()
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match="not a treeguard store"):
        ArtifactStore(tmp_path / "plain").versions()
    assert sorted(os.listdir(tmp_path)) == ["plain"] and os.listdir(tmp_path / "plain") == []


def test_gc_keeps_a_version_holding_files_it_did_not_write(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1, v2 = store.put(_params()), store.put(_params())
    (tmp_path / "versions" / v1 / "notes.txt").write_text("mine")
    (tmp_path / "versions" / v2 / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_text("also mine")
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == []
    assert (tmp_path / "versions" / v1 / "notes.txt").read_text() == "mine"
    assert (tmp_path / "outside").read_text() == "also mine"


def test_gc_keeps_the_current_version_whatever_its_status_file_says(tmp_path: Path) -> None:
    store, v1, v2 = _promoted_pair(tmp_path)
    for v in (v1, v2):  # a stale "writing" record with a dead pid, and a forged "rejected"
        record = json.loads(_status(tmp_path, v).read_text())
        record.update(status="writing" if v == v2 else "rejected", pid=2**22 + 7)
        _status(tmp_path, v).write_text(json.dumps(record))
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == []
    assert _model(tmp_path, v1).is_file() and _model(tmp_path, v2).is_file()


def test_gc_refuses_to_run_on_a_damaged_pointer(tmp_path: Path) -> None:
    store, v1, _ = _promoted_pair(tmp_path)
    (tmp_path / "CURRENT.json").write_text('{"current": 7}')
    with pytest.raises(StoreError, match="the pointer is damaged: current is not a version name"):
        store.gc(policy=RetentionPolicy(keep_last=0))
    assert _model(tmp_path, v1).is_file()


# -- 2. nothing unverified is served ---------------------------------------


def test_a_swapped_file_is_never_served(tmp_path: Path) -> None:
    store, _, v2 = _promoted_pair(tmp_path)
    other = store.put(_params(9.0))  # a valid checkpoint with valid hashes, never verified
    os.replace(_model(tmp_path, other), _model(tmp_path, v2))
    message = f"version {v2}: its checkpoint changed since it was verified"
    for op in (
        lambda: store.load_current(_params()),
        lambda: store.load_verified(v2),
        lambda: store.load_version(v2),
        lambda: store.promote(v2),
    ):
        with pytest.raises(IntegrityError, match=message) as info:
            op()
        assert info.value.version == v2
    # the fall back re-checks too, and lands on the intact former version
    assert store.load_current(_params(), fallback=True)["w"][0, 0] == 1.0
    assert store.history()[-1].action == "fallback"


def test_rollback_skips_a_swapped_former_version_and_refuses_when_none_is_left(
    tmp_path: Path,
) -> None:
    store, v1, v2 = _promoted_pair(tmp_path)
    v3 = _verified(store, 3.0)
    store.promote(v3)
    os.replace(_model(tmp_path, store.put(_params(9.0))), _model(tmp_path, v2))
    assert store.rollback() == v1  # v2 was swapped: skipped, and the skip logged
    assert "changed since it was verified" in store.history()[-1].detail["skipped"][0]
    assert store.load_current(_params())["w"][0, 0] == 1.0
    with pytest.raises(StoreError, match="no former version to roll back to passes the gates"):
        store.rollback()
    assert store.current() == v1


def test_a_byte_flipped_after_verify_is_refused_by_every_gate(tmp_path: Path) -> None:
    store, _, v2 = _promoted_pair(tmp_path)
    raw = bytearray(_model(tmp_path, v2).read_bytes())
    raw[-1] ^= 0x01
    _model(tmp_path, v2).write_bytes(bytes(raw))
    with pytest.raises(
        IntegrityError,
        match=rf"(?s)version {v2}: its checkpoint changed.*\['w'\]: f32\[2,3\]: blake3",
    ):
        store.load_current(_params())


# -- 3. verdicts land on the file they were computed on ---------------------


def test_names_are_never_reused_after_gc(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v1 = store.put(_params(), version="nightly")
    v2 = store.put(_params())
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == sorted([v1, v2])
    assert store.put(_params()) == "v000002"
    with pytest.raises(StoreError, match="version nightly existed and was removed by gc"):
        store.put(_params(), version="nightly")


def test_a_version_replaced_during_verify_gets_no_verdict(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params(1.0))
    other = store.put(_params(5.0))

    def swap_while_checking(tree: Any) -> bool:
        os.replace(_model(tmp_path, other), _model(tmp_path, v))
        return True

    with pytest.raises(StoreError, match=f"version {v} was replaced while it was verified"):
        store.verify(v, checks=[swap_while_checking])
    assert store.info(v).status == "candidate" and store.info(v).digest is None


def test_a_verdict_names_the_digest_it_was_computed_on(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = _verified(store, 1.0)
    assert store.info(v).digest == tg.read_header(_model(tmp_path, v)).digest


# -- 4. store files are safe to open ---------------------------------------


@pytest.mark.parametrize("name", ["CURRENT.json", "log.jsonl"])
def test_a_fifo_in_place_of_a_store_file_never_hangs(tmp_path: Path, name: str) -> None:
    store, _, _ = _promoted_pair(tmp_path)
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    op = store.current if name == "CURRENT.json" else store.history
    with pytest.raises(StoreError, match="is not a regular file but a FIFO|is a FIFO"):
        _within(10, op)
    if name == "CURRENT.json":
        with pytest.raises(StoreError, match="FIFO"):
            _within(10, lambda: store.load_current(_params()))


def test_a_fifo_status_file_is_listed_unreadable(tmp_path: Path) -> None:
    store, v1, _ = _promoted_pair(tmp_path)
    _status(tmp_path, v1).unlink()
    os.mkfifo(_status(tmp_path, v1))
    listed = _within(10, store.versions)
    assert [v.status for v in listed if v.version == v1] == ["unreadable"]


@pytest.mark.parametrize("name", ["log.jsonl", ".lock"])
def test_writes_never_follow_a_symlinked_store_file(tmp_path: Path, name: str) -> None:
    root, target = tmp_path / "s", tmp_path / "victim.txt"
    store = ArtifactStore(root)
    v = store.put(_params())
    target.write_text("untouched")
    (root / name).unlink()
    (root / name).symlink_to(target)
    with pytest.raises(StoreError, match="cannot open the (log for appending|lock file)"):
        store.verify(v)
    assert target.read_text() == "untouched"


@pytest.mark.parametrize("kind", ["directory", "symlink", "garbage", "huge-int", "duplicate"])
def test_a_damaged_pointer_is_a_store_error(tmp_path: Path, kind: str) -> None:
    store, _, _ = _promoted_pair(tmp_path)
    p = tmp_path / "CURRENT.json"
    p.unlink()
    if kind == "directory":
        p.mkdir()
    elif kind == "symlink":
        p.symlink_to(tmp_path / "versions")
    elif kind == "garbage":
        p.write_bytes(b"\xff\xfe")
    elif kind == "huge-int":
        p.write_text('{"current": "v000001", "previous": [], "n": ' + "9" * 5000 + "}")
    else:
        p.write_text('{"current": "v000001", "current": "v000002", "previous": []}')
    with pytest.raises(StoreError, match="CURRENT.json"):
        store.current()


def test_a_torn_log_line_never_swallows_the_next_event(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    with open(tmp_path / "log.jsonl", "ab") as f:
        f.write(b'{"time": "2026-01-01", "action": "pro')  # a crash mid-append
    store.verify(v)
    assert [e.action for e in store.history()] == ["put", "verify"]
    lines = (tmp_path / "log.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and json.loads(lines[-2])["action"] == "verify"


def test_hostile_status_json_is_reported_not_trusted(tmp_path: Path) -> None:
    store, v1, _ = _promoted_pair(tmp_path)
    _status(tmp_path, v1).write_text('{"status": "verified", "status": "rejected"}')
    with pytest.raises(StoreError, match="appears twice"):
        store.info(v1)
    _status(tmp_path, v1).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(StoreError, match="nests deeper than 512"):
        store.info(v1)
    assert store.load_current(_params())["w"][0, 0] == 2.0  # the current one is untouched


# -- 8. integrity is not authenticity: signed verdicts ----------------------


def test_a_forged_verdict_is_refused_with_the_key_and_without_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, key=KEY)
    good = _verified(store, 1.0)
    store.promote(good)
    bad = store.put(_params(np.nan))
    assert store.verify(bad, checks=[_finite]).status == "rejected"
    # Someone with write access edits the record and recomputes nothing else.
    record = json.loads(_status(tmp_path, bad).read_text())
    record.update(
        status="verified", reason=None, digest=tg.read_header(_model(tmp_path, bad)).digest
    )
    _status(tmp_path, bad).write_text(json.dumps(record))
    unkeyed = ArtifactStore(tmp_path)  # a signed store opened without its key
    for use in (unkeyed.promote, unkeyed.load_verified, unkeyed.verify):
        with pytest.raises(SignatureError, match="opened without its key: no verdict can be"):
            use(bad)
    with pytest.raises(SignatureError, match="opened without its key"):
        unkeyed.load_current()
    with pytest.raises(SignatureError, match=f"version {bad}'s verdict signature does not match"):
        store.promote(bad)
    with pytest.raises(SignatureError):
        store.load_verified(bad)
    assert store.current() == good


def test_a_forged_rejected_verdict_is_refused_as_forged_not_obeyed(tmp_path: Path) -> None:
    store, v1, v2 = _promoted_pair(tmp_path, key=KEY)
    # Someone with write access marks both good versions rejected: v2 keeps
    # its signature, v1's is dropped.
    for v, keep in ((v2, True), (v1, False)):
        record = json.loads(_status(tmp_path, v).read_text())
        record.update(status="rejected", reason="forged")
        if not keep:
            del record["signature"]
        _status(tmp_path, v).write_text(json.dumps(record))
    forged = f"version {v2}'s verdict signature does not match"
    for use in (store.promote, store.check_verified, store.load_verified):
        with pytest.raises(SignatureError, match=forged) as e:
            use(v2)
        assert e.value.version == v2
    with pytest.raises(SignatureError, match=forged):
        store.load_current()
    with pytest.raises(StoreError, match=f"skipped {v1}: version {v1}'s verdict is not signed"):
        store.rollback()
    # listed as the record says, never a crash
    assert [(v.version, v.status, v.signed) for v in store.versions()] == [
        (v1, "rejected", False),
        (v2, "rejected", True),
    ]
    # verifying again with the key replaces the forged verdict with a signed one
    assert store.verify(v2).status == "verified"
    assert store.load_current()["w"][0, 0] == 2.0
    assert store.current() == v2


def test_gc_with_a_key_counts_only_signed_verdicts_and_keeps_forged_ones(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, key=KEY)
    real = _verified(store, 1.0)
    junk = store.put(_params(3.0))
    spare = _verified(store, 2.0)
    # a newer candidate forged "verified" (unsigned), and a signed verdict turned "rejected"
    record = json.loads(_status(tmp_path, junk).read_text())
    record.update(status="verified", digest=tg.read_header(_model(tmp_path, junk)).digest)
    _status(tmp_path, junk).write_text(json.dumps(record))
    record = json.loads(_status(tmp_path, spare).read_text())
    _status(tmp_path, spare).write_text(json.dumps(record | {"status": "rejected"}))
    # the newest verified version is the real one; neither forged verdict is deleted
    assert store.gc(policy=RetentionPolicy(keep_last=0, keep_verified=1)) == []
    assert store.load_verified(real)["w"][0, 0] == 1.0
    # without a key nothing can be told apart: the newest that says verified is kept
    plain = ArtifactStore(tmp_path / "plain")
    old, new = _verified(plain, 1.0), _verified(plain, 2.0)
    assert plain.gc(policy=RetentionPolicy(keep_last=0, keep_verified=1)) == [old]
    assert [v.version for v in plain.versions()] == [new]


def test_an_unkeyed_store_reads_its_rejected_verdicts_as_before(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    good = _verified(store, 1.0)
    bad = store.put(_params(np.nan))
    assert store.verify(bad, checks=[_finite]).status == "rejected"
    with pytest.raises(StoreError, match=f"version {bad} is rejected, not verified") as e:
        store.promote(bad)
    assert not isinstance(e.value, SignatureError)
    store.promote(good)
    with pytest.raises(SignatureError, match=f"version {bad}'s verdict is not signed"):
        ArtifactStore(tmp_path, key=KEY).promote(bad)
    signed = ArtifactStore(tmp_path, key=KEY)
    assert signed.verify(bad, checks=[_finite]).status == "rejected"
    with pytest.raises(StoreError, match=f"version {bad} is rejected, not verified") as e:
        signed.promote(bad)
    assert not isinstance(e.value, SignatureError)
    with pytest.raises(SignatureError, match="opened without its key"):
        store.promote(bad)


def test_a_store_with_a_key_refuses_unsigned_and_wrongly_signed_verdicts(tmp_path: Path) -> None:
    plain = ArtifactStore(tmp_path)
    v = _verified(plain, 1.0)
    with pytest.raises(SignatureError, match=f"version {v}'s verdict is not signed"):
        ArtifactStore(tmp_path, key=KEY).promote(v)
    signed = ArtifactStore(tmp_path, key=KEY)
    assert signed.verify(v).status == "verified" and signed.info(v).signed
    signed.promote(v)
    with pytest.raises(SignatureError, match="signed with another key"):
        ArtifactStore(tmp_path, key=b"x" * 32).load_current()
    assert signed.load_current()["w"][0, 0] == 1.0


def test_the_key_can_come_from_a_file_named_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", str(key_file))
    store = ArtifactStore(tmp_path / "s")
    assert store.signed
    v = _verified(store, 1.0)
    assert ArtifactStore(tmp_path / "s", key=KEY).info(v).signed
    key_file.write_bytes(b"short")
    with pytest.raises(StoreError, match="the store key is 5 bytes; at least 16 are needed"):
        ArtifactStore(tmp_path / "s")
    key_file.unlink()
    os.mkfifo(key_file)
    with pytest.raises(StoreError, match="cannot read the key file"):
        _within(10, lambda: ArtifactStore(tmp_path / "s"))


def test_rollback_with_a_key_skips_unsigned_former_versions(tmp_path: Path) -> None:
    plain = ArtifactStore(tmp_path)
    v1 = _verified(plain, 1.0)
    plain.promote(v1)
    signed = ArtifactStore(tmp_path, key=KEY)
    v2 = _verified(signed, 2.0)
    signed.promote(v2)
    with pytest.raises(StoreError, match=rf"skipped {v1}: version {v1}'s verdict is not signed"):
        signed.rollback()
    assert signed.current() == v2


def test_an_auto_name_never_repeats_a_name_gc_retired(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.put(_params(), version="v000002")
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == ["v000002"]
    assert store.put(_params()) == "v000003"


def test_a_missing_pointer_after_promotions_stops_gc(tmp_path: Path) -> None:
    store, v1, v2 = _promoted_pair(tmp_path)
    (tmp_path / "CURRENT.json").unlink()
    with pytest.raises(StoreError, match="missing, but the store has promoted versions"):
        store.gc(policy=RetentionPolicy(keep_last=0))
    with pytest.raises(StoreError, match="the pointer is damaged"):
        store.load_current()
    assert _model(tmp_path, v1).is_file() and _model(tmp_path, v2).is_file()


def test_gc_keeps_foreign_temps_and_unrecorded_checkpoints(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    v = store.put(_params())
    (tmp_path / "versions" / v / ".review-notes.tmp").write_text("mine")
    (tmp_path / "versions" / "handmade").mkdir()
    (tmp_path / "versions" / "handmade" / "model.safetensors").write_bytes(b"mine")
    dead = tmp_path / "versions" / "v000009"
    dead.mkdir()
    (dead / f".model.safetensors.{2**22 + 5}.0badf00d.tmp").write_bytes(b"half")
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == ["v000009"]
    assert (tmp_path / "versions" / v / ".review-notes.tmp").read_text() == "mine"
    assert (tmp_path / "versions" / "handmade" / "model.safetensors").read_bytes() == b"mine"


def test_two_first_puts_at_once_agree_on_one_store_id(tmp_path: Path) -> None:
    root = tmp_path / "s"
    a, b = ArtifactStore(root, key=KEY), ArtifactStore(root, key=KEY)
    threads = [threading.Thread(target=s.put, args=(_params(),)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for v in ("v000001", "v000002"):
        assert a.verify(v).status == "verified"
        b.promote(v)  # signed under the id both see


def test_store_ls_with_the_key_lists_a_forged_verdict_as_forged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    store = ArtifactStore(root, key=KEY)
    good = _verified(store, 1.0)
    unsigned = store.put(_params(2.0))  # a candidate someone marks verified without the key
    record = json.loads(_status(root, unsigned).read_text())
    record.update(status="verified", digest=tg.read_header(_model(root, unsigned)).digest)
    _status(root, unsigned).write_text(json.dumps(record))
    edited = _verified(store, 3.0)  # a signed verdict turned "rejected" by hand
    record = json.loads(_status(root, edited).read_text())
    _status(root, edited).write_text(json.dumps(record | {"status": "rejected"}))
    bad = store.put(_params(np.nan))
    assert store.verify(bad, checks=[_finite]).status == "rejected"
    candidate = store.put(_params(4.0))
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)

    def ls(*args: str) -> str:
        out = CliRunner().invoke(main, ["store", "ls", str(root), *args], terminal_width=200)
        assert out.exit_code == 0, out.output
        return out.output

    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", str(key_file))
    listed = {v["version"]: v for v in json.loads(ls("--json"))["versions"]}
    assert {v: (e["status"], e["signature"]) for v, e in listed.items()} == {
        good: ("verified", "valid"),
        unsigned: ("verified", "forged"),  # the record as it is, and its signature
        edited: ("rejected", "forged"),
        bad: ("rejected", "valid"),
        candidate: ("candidate", None),
    }
    rows = {line.split()[0]: line for line in ls().splitlines() if line.split()[:1] != []}
    assert rows[unsigned].split()[1] == "forged"
    assert f"claims verified: version {unsigned}'s verdict is not signed" in rows[unsigned]
    assert rows[edited].split()[1] == "forged" and "claims rejected" in rows[edited]
    assert rows[good].split()[1] == "verified" and rows[bad].split()[1] == "rejected"
    # without the key nothing can be told apart: the records as they are
    monkeypatch.delenv("TREEGUARD_STORE_KEY_FILE")
    assert {e["signature"] for e in json.loads(ls("--json"))["versions"]} == {None}
