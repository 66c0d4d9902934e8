"""Partial loads: ``subtree=`` and ``ignore=`` on the bundled models' training
checkpoints, checked like a whole load, reading only the selected bytes."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click.testing import CliRunner
from flax import nnx

import treeguard as tg
from treeguard.examples import cnn, eqx_mlp


def _trained(init: Any) -> dict[str, Any]:
    """A training checkpoint's tree: params and adam's state after one step,
    with the params as their own grads (one compiled update: eager optax
    dispatches each leaf's ops one by one)."""
    params = init(jax.random.key(0))
    opt = optax.adam(1e-2)
    state = opt.init(params)
    updates, state = jax.jit(lambda p, s: opt.update(p, s, p))(params, state)
    return {"params": optax.apply_updates(params, updates), "opt_state": state}


@pytest.fixture(scope="module")
def cnn_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tree = _trained(cnn.init)
    path = tmp_path_factory.mktemp("partial") / "cnn.safetensors"
    tg.save(path, tree)
    return path, tree


def _equal(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_subtree_loads_the_params_of_a_training_checkpoint(cnn_ckpt: Any) -> None:
    path, tree = cnn_ckpt
    fresh = cnn.init(jax.random.key(1))
    got = tg.load(path, like=fresh, subtree="['params']")
    _equal(got, tree["params"])
    assert type(got) is type(fresh)


def test_ignore_leaves_the_optimizer_state_unread(cnn_ckpt: Any) -> None:
    path, tree = cnn_ckpt
    got = tg.load(path, like={"params": cnn.init(jax.random.key(1))}, ignore=["['opt_state']"])
    _equal(got, {"params": tree["params"]})


def test_subtree_without_like_rebuilds_the_stored_part(cnn_ckpt: Any) -> None:
    path, tree = cnn_ckpt
    got = tg.load(path, subtree="['params']['linear2']")
    assert sorted(got) == ["bias", "kernel"]
    np.testing.assert_array_equal(
        got["kernel"]["value"], np.asarray(tree["params"]["linear2"]["kernel"][...])
    )


@pytest.mark.slow
def test_subtree_and_ignore_together_on_the_equinox_mlp(tmp_path: Path) -> None:
    tree = _trained(eqx_mlp.init)
    path = tmp_path / "eqx.safetensors"
    tg.save(path, tree)
    got = tg.load(path, like=tree["opt_state"][0].mu, subtree="['opt_state'][0].nu")
    _equal(got, tree["opt_state"][0].nu)
    fresh = eqx_mlp.init(jax.random.key(1))
    got = tg.load(path, like={"params": fresh}, ignore=["['opt_state']"])
    _equal(got, {"params": tree["params"]})


def test_every_mismatch_of_the_selected_part_is_listed(cnn_ckpt: Any) -> None:
    path, _ = cnn_ckpt
    like = cnn.init(jax.random.key(1))
    like["linear2"]["kernel"] = nnx.Param(jnp.zeros((32, 11)))
    like["conv1"]["bias"] = nnx.Param(jnp.zeros(8, jnp.bfloat16))
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like=like, subtree="['params']")
    kinds = {(m.path, m.kind) for m in info.value.mismatches}
    assert kinds == {
        ("['linear2']['kernel'].value", "shape"),
        ("['conv1']['bias'].value", "dtype"),
    }
    assert "opt_state" not in str(info.value)


def test_a_part_left_out_of_like_is_still_a_mismatch(cnn_ckpt: Any) -> None:
    path, _ = cnn_ckpt
    with pytest.raises(tg.TreeMismatchError, match=r"\['opt_state'\]"):
        tg.load(path, like={"params": cnn.init(jax.random.key(1))})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"subtree": "['param']"},
            "subtree: ['param'] names no leaf or subtree of the checkpoint\n"
            "hint: did you mean ['params']?",
        ),
        (
            {"ignore": ["['opt_stat']"]},
            "ignore: ['opt_stat'] names no leaf or subtree of the checkpoint\n"
            "hint: did you mean ['opt_state']?",
        ),
        (
            {"subtree": "['params']['conv1']", "ignore": ["['params']"]},
            "subtree: ['params']['conv1'] lies inside ['params'], which `ignore` leaves "
            "unread\nhint: drop that path from ignore, or pick another subtree",
        ),
        (
            {"ignore": [""]},
            "ignore: the root names the whole tree; nothing would be loaded\n"
            "hint: name the subtrees to leave unread",
        ),
        (
            {"ignore": "['opt_state']"},
            "ignore: a collection of key paths, got one string\n"
            "hint: pass ignore=[\"['opt_state']\"]",
        ),
    ],
    ids=["subtree-near-miss", "ignore-near-miss", "subtree-inside-ignore", "ignore-root", "str"],
)
def test_a_selection_that_names_nothing_is_refused_with_the_nearest_path(
    cnn_ckpt: Any, options: dict[str, Any], message: str
) -> None:
    path, _ = cnn_ckpt
    with pytest.raises(tg.ConfigError) as info:
        tg.load(path, like=None, **options)
    assert str(info.value).endswith(message)
    assert info.value.exit_code == 2


def test_a_foreign_file_refuses_a_selection(tmp_path: Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    f = tmp_path / "hf.safetensors"
    safetensors_numpy.save_file({"enc.w": np.ones(2, np.float32)}, str(f))
    with pytest.raises(
        tg.ConfigError,
        match="subtree, ignore, missing, unexpected and report work on the key paths",
    ):
        tg.load(f, unverified="allow", subtree="['enc']")


def test_rename_applies_inside_the_selected_part(cnn_ckpt: Any) -> None:
    path, tree = cnn_ckpt
    params = cnn.init(jax.random.key(1))
    like = nnx.State({"out": dict(params["linear2"].items())})  # State holds plain dicts
    got = tg.load(
        path,
        like=like,
        subtree="['params']",
        rename={"['linear2']": "['out']"},
        ignore=["['params']['conv1']", "['params']['conv2']", "['params']['linear1']"],
    )
    _equal(got["out"], tree["params"]["linear2"])


def test_a_corrupt_tensor_outside_the_selection_is_not_read(tmp_path: Path) -> None:
    tree = {"enc": np.arange(4, dtype=np.float32), "head": np.arange(3, dtype=np.float32)}
    path = tmp_path / "c.safetensors"
    tg.save(path, tree)
    h = tg.read_header(path)
    head = next(t for t in h.tensors if t.name == "['head']")
    with open(path, "r+b") as f:
        f.seek(h.header_bytes + 8 + head.begin)
        f.write(b"\xff")
    got = tg.load(path, like={"enc": tree["enc"]}, ignore=["['head']"])
    np.testing.assert_array_equal(got["enc"], tree["enc"])
    with pytest.raises(tg.IntegrityError, match=r"\['head'\]"):
        tg.load(path, like=tree["head"], subtree="['head']")


def _bytes_read() -> tuple[int, int]:
    """The process's bytes read so far (taken before this read of the counter
    itself), and how many bytes this read of the counter took."""
    with open(f"/proc/{os.getpid()}/io", "rb") as f:
        text = f.read()
    found = [int(line.split()[1]) for line in text.splitlines() if line.startswith(b"rchar:")]
    if not found:  # gVisor's /proc (the TPU machine's) counts no bytes read
        pytest.skip("this kernel's /proc/self/io has no rchar to count bytes read with")
    return found[0], len(text)


def _count_partial_read(path: Path, like: Any, subtree: str) -> tuple[int, int]:
    h = tg.read_header(path)
    selected = sum(t.nbytes for t in h.tensors if t.name.startswith(subtree))
    tg.load(path, like=like, subtree=subtree)  # warm: every module imported
    before, own = _bytes_read()
    tg.load(path, like=like, subtree=subtree)
    return _bytes_read()[0] - before - own, selected + 8 + h.header_bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts bytes in /proc")
def test_a_partial_load_reads_only_the_selected_bytes_and_the_header(tmp_path: Path) -> None:
    tree = {f"layer{i}": np.full((64, 64), i, np.float32) for i in range(8)}
    path = tmp_path / "eight.safetensors"
    tg.save(path, tree)
    read, allowed = _count_partial_read(path, tree["layer3"], "['layer3']")
    assert read <= allowed
    assert read >= 64 * 64 * 4


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts bytes in /proc")
def test_a_subtree_of_a_256_mib_checkpoint_reads_an_eighth(tmp_path: Path) -> None:
    part = 32 * 1024 * 1024 // 4
    tree = {f"block{i}": {"w": np.full(part, i, np.float32)} for i in range(8)}
    path = tmp_path / "big.safetensors"
    tg.save(path, tree)
    del tree
    like = {"w": np.zeros(part, np.float32)}
    read, allowed = _count_partial_read(path, like, "['block5']")
    assert 32 * 1024 * 1024 <= read <= allowed


def test_the_store_loads_a_part_of_its_current_version(tmp_path: Path, cnn_ckpt: Any) -> None:
    _, tree = cnn_ckpt
    store = tg.ArtifactStore(tmp_path / "store")
    v = store.put(tree)
    assert store.verify(v).status == "verified"
    store.promote(v)
    like = cnn.init(jax.random.key(1))
    _equal(store.load_current(like, subtree="['params']"), tree["params"])
    _equal(
        store.load_verified(v, {"params": like}, ignore=["['opt_state']"]),
        {"params": tree["params"]},
    )
    _equal(store.load_version(v, like, subtree="['params']"), tree["params"])
    with pytest.raises(tg.ConfigError, match="did you mean"):
        store.load_current(like, subtree="['parms']")


def test_load_sharded_restores_a_subtree(tmp_path: Path) -> None:
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    tree = {
        "params": {"w": jax.device_put(jnp.arange(8.0), sharding)},
        "opt_state": {"m": jax.device_put(jnp.ones(8), sharding)},
    }
    d = tmp_path / "sharded"
    tg.save_sharded(d, tree)
    got = tg.load_sharded(d, tree["params"], subtree="['params']")
    np.testing.assert_array_equal(got["w"], np.arange(8.0))
    got = tg.load_sharded(d, {"params": tree["params"]}, ignore=["['opt_state']"])
    np.testing.assert_array_equal(got["params"]["w"], np.arange(8.0))
    with pytest.raises(tg.ConfigError, match=r"did you mean \['params'\]\?"):
        tg.load_sharded(d, tree["params"], subtree="['param']")


def test_ckpt_inspect_lists_a_subtree(cnn_ckpt: Any) -> None:
    from treeguard._cli.main import main

    path, _ = cnn_ckpt
    result = CliRunner().invoke(main, ["ckpt", "inspect", str(path), "--subtree", "['params']"])
    assert result.exit_code == 0, result.output
    assert " 8 tensors " in result.output
    assert "opt_state" not in result.output
    result = CliRunner().invoke(main, ["ckpt", "inspect", str(path), "--subtree", "['parms']"])
    assert result.exit_code == 2
    assert "did you mean ['params']?" in result.output
