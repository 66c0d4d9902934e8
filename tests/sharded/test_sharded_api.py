"""save_sharded and load_sharded in one process on one device: the contract
before any read, migrations, the sha256 check, atomic replacement, the CLI."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from shardtools import MANIFEST_NAME, data_dir, flip_byte, read, sharded_digest

import treeguard
from treeguard._cli.ckpt import ckpt

# one worker runs the file: its module fixture (a saved sharded checkpoint) is saved once, not
# once in each worker
pytestmark = pytest.mark.xdist_group("sharded_api")

#: More than 1 KiB, so OCDBT stores it in a data file rather than inline in its index.
W = (np.arange(512, dtype=np.float32).reshape(32, 16) * 1.5 + 0.25).astype(np.float32)


def _params() -> dict[str, Any]:
    return {
        "dense1": {"w": jnp.asarray(W), "b": jnp.arange(16, dtype=jnp.bfloat16)},
        "dense2": {"w": jnp.ones((16, 2), jnp.int8), "b": jnp.asarray(3.0)},
    }


def _abstract(tree: Any) -> Any:
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sharded") / "ckpt"
    treeguard.save_sharded(d, _params(), metadata={"step": 7})
    return d


@pytest.fixture
def copy(saved: Path, tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    return d


def _same(a: Any, b: Any) -> None:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_round_trip_bit_exact(saved: Path) -> None:
    out = treeguard.load_sharded(saved, _abstract(_params()))
    _same(out, _params())
    assert isinstance(out["dense2"]["b"], jax.Array)
    live = treeguard.load_sharded(saved, _params())
    _same(live, _params())
    assert read(saved)["metadata"] == {"step": 7}
    assert sorted(os.listdir(saved)) == sorted([MANIFEST_NAME, read(saved)["data"]])


def test_contract_is_checked_before_any_read(copy: Path) -> None:
    shutil.rmtree(data_dir(copy))
    like = _abstract(_params())
    like["dense_1"] = like.pop("dense1")
    like["dense2"]["w"] = jax.ShapeDtypeStruct(
        (16, 2), jnp.int32, sharding=like["dense2"]["b"].sharding
    )
    with pytest.raises(treeguard.TreeMismatchError) as e:
        treeguard.load_sharded(copy, like)
    assert str(e.value) == (
        f"{copy}: 3 mismatches between the checkpoint and `like`:\n"
        "  ['dense2']['w']: dtype int32 in `like`, int8 in the checkpoint\n"
        "  ['dense_1']: missing: dict of 2 leaves (bf16[16], f32[32,16]) in `like`, absent in "
        "the checkpoint\n"
        "  ['dense1']: unexpected: dict of 2 leaves (bf16[16], f32[32,16]) in the checkpoint, "
        "absent in `like`\n"
        "hint: `['dense1']` in the checkpoint: did you mean `['dense_1']`?"
    )
    assert {m.kind for m in e.value.mismatches} == {"missing", "unexpected", "dtype"}


def test_missing_data_is_an_integrity_error(copy: Path) -> None:
    shutil.rmtree(data_dir(copy))
    with pytest.raises(
        treeguard.IntegrityError, match=r"the stored arrays \[.*\] could not be read"
    ):
        treeguard.load_sharded(copy, _abstract(_params()))


def test_a_flipped_byte_names_the_array(copy: Path) -> None:
    flip_byte(copy, W[0, 1:4].tobytes())
    with pytest.raises(treeguard.IntegrityError) as e:
        treeguard.load_sharded(copy, _abstract(_params()))
    assert str(e.value) == (
        f"{copy}: 1 array with a shard whose blake3 does not match the manifest: ['dense1']['w']\n"
        "hint: the stored bytes changed after the save; load an earlier checkpoint"
    )
    assert e.value.path == "['dense1']['w']"
    res = CliRunner().invoke(ckpt, ["verify", str(copy)])
    assert res.exit_code == 1 and "['dense1']['w']" in res.output


def test_rename_and_allow_missing(saved: Path) -> None:
    like = _abstract(_params())
    like["encoder"] = like.pop("dense1")
    out = treeguard.load_sharded(saved, like, rename={"['dense1']": "['encoder']"})
    np.testing.assert_array_equal(np.asarray(out["encoder"]["w"]), W)
    with pytest.raises(ValueError, match=r"rename: \['dense9'\] names no leaf or subtree"):
        treeguard.load_sharded(saved, like, rename={"['dense9']": "['encoder']"})
    grown = _params()
    grown["head"] = {"w": jnp.full((2,), 5.0)}
    out = treeguard.load_sharded(saved, grown, allow_missing=["['head']"])
    assert np.asarray(out["head"]["w"]).tolist() == [5.0, 5.0]
    _same({k: v for k, v in out.items() if k != "head"}, _params())
    with pytest.raises(ValueError, match="holds no value to keep there"):
        treeguard.load_sharded(saved, _abstract(grown), allow_missing=["['head']"])
    with pytest.raises(treeguard.TreeMismatchError, match="after rename"):
        treeguard.load_sharded(saved, grown, rename={"['dense1']": "['encoder']"})


def test_surgery_options_work_as_for_load_and_report_the_same(saved: Path, tmp_path: Path) -> None:
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    new = _abstract({k: v for k, v in _params().items() if k != "dense2"})
    new["head"] = {"w": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=one)}
    init = {"head": {"w": jnp.full((2,), 0.5)}}
    out, report = treeguard.load_sharded(
        saved, new, missing="init", init=init, unexpected=["['dense2']"], report=True
    )
    assert np.asarray(out["head"]["w"]).tolist() == [0.5, 0.5]
    assert out["head"]["w"].sharding == one
    np.testing.assert_array_equal(np.asarray(out["dense1"]["w"]), W)
    assert [(c.action, c.path) for c in report.changes] == [
        ("initialised", "['head']['w']"),
        ("dropped", "['dense2']['b']"),
        ("dropped", "['dense2']['w']"),
    ]
    # one implementation: a single-file checkpoint of the same tree reports the same
    treeguard.save(tmp_path / "p.safetensors", _params())
    _, same = treeguard.load(
        tmp_path / "p.safetensors",
        like=new,
        missing="init",
        init=init,
        unexpected=["['dense2']"],
        report=True,
    )
    assert same.changes == report.changes
    dropped = treeguard.load_sharded(saved, new, missing="init", init=init, unexpected="drop")
    _same(dropped, out)
    with pytest.raises(treeguard.ConfigError, match='missing="init" needs init='):
        treeguard.load_sharded(saved, new, missing="init")
    with pytest.raises(treeguard.TreeMismatchError) as info:
        treeguard.load_sharded(saved, new, unexpected="drop")  # the head still has no value
    assert [m.path for m in info.value.mismatches] == ["['head']['w']"]
    with pytest.raises(treeguard.TreeMismatchError, match=r"\['head'\]\['w'\]: shape"):
        treeguard.load_sharded(
            saved, new, missing="init", init={"head": {"w": jnp.ones(3)}}, unexpected="drop"
        )


def test_refusals(saved: Path, tmp_path: Path) -> None:
    like = jax.tree.map(np.asarray, _params())
    with pytest.raises(ValueError, match=r"\['dense1'\]\['b'\]: `like` needs a jax.Array or"):
        treeguard.load_sharded(saved, like)
    with pytest.raises(
        TypeError, match=r"\['w'\]: save_sharded stores jax.Array leaves, got ndarray"
    ):
        treeguard.save_sharded(tmp_path / "x", {"w": np.zeros(2)})
    with pytest.raises(TypeError, match=r"metadata\['s'\]: an object of type set has no JSON form"):
        treeguard.save_sharded(tmp_path / "x", {"w": jnp.zeros(2)}, metadata={"s": {1}})
    with pytest.raises(treeguard.InvalidTreeError) as e:
        treeguard.save_sharded(tmp_path / "x", {"w": jnp.zeros(2), "rng": jax.random.key(0)})
    assert str(e.value).startswith(
        "1 invalid leaf or node in the tree:\n"
        "  ['rng']: a typed PRNG key array (key<fry>): orbax stores no key dtype\n"
        "hint: save the key data, `jax.random.key_data(k)`"
    )
    assert not (tmp_path / "x").exists()
    with pytest.raises(treeguard.FormatError, match="not a sharded checkpoint"):
        treeguard.load_sharded(tmp_path, _params())


def test_a_manifest_that_cannot_be_written_fails_the_save(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME / "x").mkdir(parents=True)
    with pytest.raises(OSError):
        treeguard.save_sharded(tmp_path, {"w": jnp.zeros(2)})
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert (tmp_path / MANIFEST_NAME).is_dir()  # left as it was: no manifest written


def test_a_new_save_replaces_the_old_and_clears_leftovers(copy: Path) -> None:
    old = read(copy)["data"]
    digest = sharded_digest(copy)
    (copy / f"{old[:-1]}0.orbax-checkpoint-tmp-123").mkdir()
    (copy / f".{MANIFEST_NAME}.abcd.tmp").write_text("{")
    (copy / "notes.txt").write_text("mine")
    newer = _params()
    newer["dense1"]["b"] = newer["dense1"]["b"] + 1
    treeguard.save_sharded(copy, newer, metadata={"step": 8})
    assert stat.S_ISREG(os.lstat(copy / MANIFEST_NAME).st_mode)  # a regular file, never a link
    assert sharded_digest(copy) != digest
    assert sorted(os.listdir(copy)) == sorted([MANIFEST_NAME, read(copy)["data"], "notes.txt"])
    _same(treeguard.load_sharded(copy, _abstract(newer)), newer)


def test_cli_inspect_and_verify(saved: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(ckpt, ["inspect", str(saved)])
    assert res.exit_code == 0, res.output
    assert "treeguard.sharded/1  4 arrays  561 params  2.1 KiB" in res.output
    assert "['dense1']['w']  f32[32,16]" in res.output and "1 shard  single" in res.output
    assert "0: 4 shards, 2.1 KiB" in res.output and 'metadata: {"step": 7}' in res.output
    doc = json.loads(runner.invoke(ckpt, ["inspect", "--json", str(saved)]).output)
    assert doc["processes"] == [{"process": 0, "shards": 4, "nbytes": 2116}]
    assert doc["digest"] == sharded_digest(saved)
    res = runner.invoke(ckpt, ["verify", str(saved)])
    assert res.exit_code == 0, res.output
    assert "4 arrays, 4 shards, 2.1 KiB, every blake3 matches" in res.output
    other = tmp_path / "other.json"
    spec = treeguard.spec_of(_params())
    treeguard.TreeSpec.from_json(spec.to_json().replace('"int8"', '"int16"')).save(other)
    res = runner.invoke(ckpt, ["verify", str(saved), "--like", str(other)])
    assert res.exit_code == 1 and f"int16 in {other}, int8 in the checkpoint" in res.output
    assert runner.invoke(ckpt, ["inspect", str(tmp_path)]).exit_code == 2


def test_resharding_is_logged(saved: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="treeguard.sharded")
    treeguard.load_sharded(saved, _abstract(_params()))
    assert caplog.records == []


@pytest.mark.parametrize(
    ("rename", "allow_missing", "like_of"),
    [
        ({"['dense9']": "['encoder']"}, (), "encoder"),
        ({"['dense1']['w']": "['x']", "['dense1']['b']": "['x']"}, (), "plain"),
        ({}, ("['nothing']",), "plain"),
        ({"['dense1']": "['encoder']"}, ("['extra']",), "extra-abstract"),
        ({"['dense1']": "['encoder']"}, (), "encoder-wrong"),
    ],
    ids=[
        "rename-names-nothing",
        "renames-collide",
        "allow-missing-nothing",
        "no-value",
        "mismatch",
    ],
)
def test_a_migration_fails_alike_for_a_file_and_a_sharded_checkpoint(
    saved: Path,
    tmp_path: Path,
    rename: dict[str, str],
    allow_missing: tuple[str, ...],
    like_of: str,
) -> None:
    file = tmp_path / "model.safetensors"
    treeguard.save(file, jax.tree.map(np.asarray, _params()))
    like = _abstract(_params())
    if like_of.startswith("encoder"):
        like["encoder"] = like.pop("dense1")
    if like_of == "encoder-wrong":
        one = like["dense2"]["b"].sharding
        like["encoder"]["w"] = jax.ShapeDtypeStruct((32, 17), jnp.float32, sharding=one)
    if like_of == "extra-abstract":
        like["encoder"] = like.pop("dense1")
        like["extra"] = jax.ShapeDtypeStruct(
            (2,), jnp.float32, sharding=like["dense2"]["b"].sharding
        )
    errors = []
    for where, load in ((saved, treeguard.load_sharded), (file, treeguard.load)):
        with pytest.raises((ValueError, treeguard.TreeMismatchError)) as e:
            if load is treeguard.load:
                load(where, like=like, rename=rename, allow_missing=allow_missing)
            else:
                load(where, like, rename=rename, allow_missing=allow_missing)
        errors.append((type(e.value), str(e.value).replace(str(where), "WHERE")))
    assert errors[0] == errors[1]
    assert "WHERE" in errors[0][1] or "`like`" in errors[0][1]
