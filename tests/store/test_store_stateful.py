"""The store as a state machine: put (of a file or a sharded version, or, once
dedup is turned on, a tensors version sharing its tensors), verify, promote,
rollback, gc, tampering (of a tensor object shared by every tensors version
of the same weights, and by the ones put after it while it is held) and what
a kill leaves behind, interleaved at random by hypothesis.

After every step the invariants hold: the current version loads and matches
its verified digest (or, if its bytes were tampered with, is refused); every
verified version the pointer remembers is still there; no name is handed out
twice; and nothing outside the store changed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import treeguard as tg
from tests.sharded.shardtools import MANIFEST_NAME, sharded_digest  # what a version holds
from treeguard import ArtifactStore, IntegrityError, RetentionPolicy, StoreError

DEAD_PID = 2**22 + 4321  # above the default pid_max: no such process
KEY = b"s" * 32


def _params(scale: float) -> dict[str, Any]:
    # w is over 1 KiB, so a sharded version keeps it in a data file, not inline in its index
    return {"w": np.full((32, 16), scale, np.float32), "b": np.full(2, scale, np.float32)}


def _like() -> dict[str, Any]:
    return {k: jnp.asarray(v) for k, v in _params(0.0).items()}


def _flip_stored(version_dir: Path, needle: bytes) -> bool:
    """Flips a bit of the first stored copy of ``needle`` under a sharded
    version's data; False if there is none left."""
    for path in sorted(p for p in version_dir.rglob("*") if p.is_file()):
        if path.name in ("status.json", MANIFEST_NAME):
            continue
        raw = bytearray(path.read_bytes())
        at = raw.find(needle)
        if at >= 0:
            raw[at + len(needle) // 2] ^= 0x01
            path.write_bytes(bytes(raw))
            return True
    return False


def _finite(tree: Any) -> bool:
    return bool(np.isfinite(tree["w"]).all())


class StoreMachine(RuleBasedStateMachine):
    """A model of the store beside a real one on disk."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tg-store-"))
        self.root = self.dir / "store"
        (self.dir / "outside.txt").write_text("untouched")
        self.store = ArtifactStore(self.root, key=KEY)
        self.scale: dict[str, float] = {}  # version -> the scale it was put with
        self.verified: set[str] = set()
        self.rejected: set[str] = set()
        self.tampered: set[str] = set()
        self.removed: set[str] = set()
        self.names: list[str] = []
        self.sharded: set[str] = set()
        self.tensors: set[str] = set()
        self.dedup = False
        self.bad: dict[str, str] = {}  # repr(scale) -> the tampered object that holds its w

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers -----------------------------------------------------------

    def _model(self, v: str) -> Path:
        if v in self.tensors:
            return self.root / "versions" / v / "tensors.json"
        if v in self.sharded:
            return self.root / "versions" / v / MANIFEST_NAME
        return self.root / "versions" / v / "model.safetensors"

    def _digest(self, v: str) -> str:
        if v in self.tensors:  # the header the manifest holds, as written
            header = json.loads(json.loads(self._model(v).read_text())["header"])
            return str(header["__metadata__"]["treeguard.digest"])
        if v in self.sharded:
            return sharded_digest(self.root / "versions" / v)
        return tg.read_header(self._model(v)).digest

    def _live(self) -> list[str]:
        return [v for v in self.names if v not in self.removed]

    @initialize()
    def first_put(self) -> None:
        self._put(1.0)

    def _put(self, scale: float, *, sharded: bool = False) -> str:
        if sharded:
            v = self.store.put_sharded({k: jnp.asarray(x) for k, x in _params(scale).items()})
            self.sharded.add(v)
        else:
            v = self.store.put(_params(scale))
            if self.dedup:
                self.tensors.add(v)
                if repr(scale) in self.bad:  # the put reuses the object held: tampered at birth
                    self.tampered.add(v)
        assert v not in self.names, f"name {v} handed out twice"
        self.names.append(v)
        self.scale[v] = scale
        return v

    # -- rules -------------------------------------------------------------

    @rule(scale=st.sampled_from([0.5, 2.0, 3.0, float("nan")]))
    def put(self, scale: float) -> None:
        self._put(scale)

    @rule(scale=st.sampled_from([0.5, 2.0, float("nan")]))
    def put_sharded(self, scale: float) -> None:
        self._put(scale, sharded=True)

    @precondition(lambda self: not self.dedup)
    @rule()
    def turn_dedup_on(self) -> None:
        ArtifactStore.init(self.root, dedup=True)
        self.dedup = True

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def verify(self, data: st.DataObject) -> None:
        live = self._live()
        v = data.draw(st.sampled_from(live))
        info = self.store.verify(v, checks=[_finite])
        good = np.isfinite(self.scale[v]) and v not in self.tampered
        if info.status == "verified":
            assert good, f"{v} verified, but it is non-finite or tampered"
            self.verified.add(v)
            self.rejected.discard(v)
        else:
            assert not good or self.store.current() not in (None, v), info.reason
            self.rejected.add(v)
            self.verified.discard(v)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        v = data.draw(st.sampled_from(self._live()))
        before = self.store.current()
        try:
            self.store.promote(v)
        except (StoreError, IntegrityError):
            assert v not in self.verified or v in self.tampered
            assert self.store.current() == before
            return
        assert v in self.verified and v not in self.tampered
        assert self.store.current() == v

    @rule()
    def rollback(self) -> None:
        before = self.store.current()
        try:
            now = self.store.rollback()
        except StoreError:
            assert self.store.current() == before
            return
        assert now in self.verified and now not in self.tampered

    @rule(keep=st.integers(0, 3))
    def gc(self, keep: int) -> None:
        protected = {self.store.current(), *self._pointer_stack()}
        removed = self.store.gc(policy=RetentionPolicy(keep_last=keep))
        assert not protected & set(removed), f"gc removed {protected & set(removed)}"
        self.removed.update(removed)
        for scale, obj in list(self.bad.items()):  # deleted once no version names it
            if not (self.root / "tensors" / obj).exists():
                del self.bad[scale]
        versions = self.root / "versions"
        left = {n for n in os.listdir(versions) if (versions / n / "status.json").exists()}
        for v in left:
            if json.loads((versions / v / "status.json").read_text())["status"] == "writing":
                raise AssertionError(f"gc left {v}, written by a dead process")

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def tamper(self, data: st.DataObject) -> None:
        v = data.draw(st.sampled_from(self._live()))
        if v in self.tensors:
            self._tamper_tensor(v)
            return
        if v in self.sharded:
            needle = np.full(4, self.scale[v], np.float32).tobytes()
            if _flip_stored(self.root / "versions" / v, needle):
                self.tampered.add(v)
            return
        path = self._model(v)
        raw = bytearray(path.read_bytes())
        raw[-1] = (raw[-1] + 1) % 256  # the last byte is array data; never back to the original
        path.write_bytes(bytes(raw))
        self.tampered.add(v)

    def _tamper_tensor(self, v: str) -> None:
        """Changes the object holding ``v``'s w: every tensors version of the
        same weights holds it too."""
        objects = json.loads(self._model(v).read_text())["objects"]
        w = next(o for o in objects if (self.root / "tensors" / o).stat().st_size == 32 * 16 * 4)
        path = self.root / "tensors" / w
        raw = bytearray(path.read_bytes())
        raw[-1] = (raw[-1] + 1) % 256
        os.chmod(path, 0o644)
        path.write_bytes(bytes(raw))
        key = repr(self.scale[v])
        self.bad[key] = w
        self.tampered.update(u for u in self.tensors if repr(self.scale[u]) == key)

    @rule()
    def killed_mid_put(self) -> None:
        """What a SIGKILL inside ``put`` leaves: a reserved directory with a
        ``writing`` record of a dead process and a half-written temp file."""
        marker = json.loads((self.root / "STORE.json").read_text())
        name = f"v{marker['counter'] + 1:06d}"
        marker["counter"] += 1
        (self.root / "STORE.json").write_text(json.dumps(marker))
        d = self.root / "versions" / name
        d.mkdir()
        (d / "status.json").write_text(
            json.dumps({"status": "writing", "pid": DEAD_PID, "uid": "dead", "created": "z"})
        )
        (d / f".model.safetensors.{DEAD_PID}.0badf00d.tmp").write_bytes(b"\x00" * 17)
        self.names.append(name)
        self.removed.add(name)  # never loadable; gc may take it at any time

    @rule()
    def killed_mid_sharded_put(self) -> None:
        """What a SIGKILL inside ``put_sharded`` leaves: a ``writing`` record
        of a dead process, orbax's temporary data directory and a manifest
        temp file; gc must reclaim all of it."""
        marker = json.loads((self.root / "STORE.json").read_text())
        marker["counter"] += 1
        name = f"v{marker['counter']:06d}"
        (self.root / "STORE.json").write_text(json.dumps(marker))
        d = self.root / "versions" / name
        tmp = d / "data-0123456789abcdef.orbax-checkpoint-tmp-1700000000" / "d"
        tmp.mkdir(parents=True)
        (tmp / "0badf00d").write_bytes(b"\x00" * 33)
        (d / "status.json").write_text(
            json.dumps(
                {
                    "status": "writing",
                    "pid": DEAD_PID,
                    "uid": "dead",
                    "created": "z",
                    "kind": "sharded",
                }
            )
        )
        (d / f".{MANIFEST_NAME}.{DEAD_PID}.0badf00d.tmp").write_bytes(b"{")
        self.names.append(name)
        self.removed.add(name)

    @rule()
    def killed_mid_pointer_write(self) -> None:
        """A SIGKILL inside an atomic replace leaves only a temp file."""
        (self.root / f".CURRENT.json.{DEAD_PID}.deadbeef.tmp").write_text('{"current": "x"')

    @precondition(lambda self: self.store.current() is not None)
    @rule()
    def load_current(self) -> None:
        cur = self.store.current()
        assert cur is not None
        if cur not in self.verified:
            with pytest.raises(StoreError):
                self.store.load_current(_like())
        elif cur in self.tampered:
            with pytest.raises(IntegrityError, match=f"version {cur}"):
                self.store.load_current(_like())
        else:
            tree = self.store.load_current(_like())
            assert float(tree["w"][0, 0]) == self.scale[cur]

    # -- invariants -------------------------------------------------------

    def _pointer_stack(self) -> list[str]:
        p = self.root / "CURRENT.json"
        return json.loads(p.read_text())["previous"] if p.exists() else []

    @invariant()
    def current_is_verified_and_intact_or_refused(self) -> None:
        cur = self.store.current()
        if cur is None:
            return
        info = self.store.info(cur)
        if cur not in self.verified:
            # promoted while verified, then verified again and rejected: never served
            assert info.status == "rejected"
            with pytest.raises(StoreError, match=f"version {cur} is rejected"):
                self.store.load_current(_like())
            return
        assert info.status == "verified" and info.signed
        if cur not in self.tampered:
            assert self._digest(cur) == info.digest

    @invariant()
    def no_remembered_verified_version_is_lost(self) -> None:
        for v in [self.store.current(), *self._pointer_stack()]:
            if v is not None:
                assert self._model(v).is_file(), f"{v} is remembered by the pointer but gone"

    @invariant()
    def names_are_unique_and_outside_is_untouched(self) -> None:
        assert len(set(self.names)) == len(self.names)
        assert (self.dir / "outside.txt").read_text() == "untouched"
        assert sorted(os.listdir(self.dir)) == ["outside.txt", "store"]


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


StoreMachine.TestCase.settings = _settings(10)
test_store_state_machine = StoreMachine.TestCase


@pytest.mark.reliability
@pytest.mark.long(70)
def test_reliability_store_state_machine_long() -> None:
    examples = int(os.environ.get("TREEGUARD_STATEFUL_EXAMPLES", "300"))
    run_state_machine_as_test(StoreMachine, settings=_settings(examples))
