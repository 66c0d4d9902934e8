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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treeguard as tg
from tests.drawn import cnn_params
from treeguard.examples import eqx_mlp

# one worker runs the file: its module fixture (a trained CNN checkpoint) is saved once, not
# once in each worker
pytestmark = pytest.mark.xdist_group("ckpt_partial")


def _trained(params: Any) -> dict[str, Any]:
    """A training checkpoint's tree: params and adam's state after one step,
    with the params as their own grads (one compiled update: eager optax
    dispatches each leaf's ops one by one)."""
    opt = optax.adam(1e-2)
    state = opt.init(params)
    updates, state = jax.jit(lambda p, s: opt.update(p, s, p))(params, state)
    return {"params": optax.apply_updates(params, updates), "opt_state": state}


@pytest.fixture(scope="module")
def cnn_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tree = _trained(cnn_params(0))
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
    fresh = cnn_params(1)
    got = tg.load(path, like=fresh, subtree="['params']")
    _equal(got, tree["params"])
    assert type(got) is type(fresh)


def test_ignore_leaves_the_optimizer_state_unread(cnn_ckpt: Any) -> None:
    path, tree = cnn_ckpt
    got = tg.load(path, like={"params": cnn_params(1)}, ignore=["['opt_state']"])
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
    tree = _trained(eqx_mlp.init(jax.random.key(0)))
    path = tmp_path / "eqx.safetensors"
    tg.save(path, tree)
    got = tg.load(path, like=tree["opt_state"][0].mu, subtree="['opt_state'][0].nu")
    _equal(got, tree["opt_state"][0].nu)
    fresh = eqx_mlp.init(jax.random.key(1))
    got = tg.load(path, like={"params": fresh}, ignore=["['opt_state']"])
    _equal(got, {"params": tree["params"]})


def test_every_mismatch_of_the_selected_part_is_listed(cnn_ckpt: Any) -> None:
    path, _ = cnn_ckpt
    like = cnn_params(1)
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
        tg.load(path, like={"params": cnn_params(1)})


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
    params = cnn_params(1)
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
    like = cnn_params(1)
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


# -- parts of an nnx State and of an equinox module ----------------------------------


def _leaves_equal(a: Any, b: Any) -> bool:
    def raw(x: Any) -> Any:
        is_key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(x) if is_key else x)

    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return all(np.array_equal(raw(x), raw(y)) for x, y in pairs)


def test_subtree_loads_a_part_of_an_nnx_state_into_its_state(tmp_path: Path) -> None:
    from nnxmodels import Net

    state = nnx.state(Net(nnx.Rngs(0)))
    path = tmp_path / "train.safetensors"
    tg.save(path, {"params": state, "step": np.int32(3)})
    for part in ("encoder", "norm"):  # a Param-only part, and BatchNorm's stats with its params
        got = tg.load(path, like=state[part], subtree=f"['params']['{part}']")
        assert type(got) is type(state[part])
        assert _leaves_equal(got, state[part])
    # the State inside a dict, a part of it in a dict of the same form
    got = tg.load(path, like={"params": state}, ignore=["['step']"])
    assert type(got["params"]) is type(state)


def test_ignore_leaves_the_batch_stats_and_rngs_of_an_nnx_state_unread(tmp_path: Path) -> None:
    from nnxmodels import Net

    model = Net(nnx.Rngs(0))
    path = tmp_path / "m.safetensors"
    tg.save(path, nnx.state(model))
    params = nnx.state(model, nnx.Param)
    got = tg.load(path, like=params, ignore=["['norm']['mean']", "['norm']['var']", "['drop']"])
    assert type(got) is type(params)
    assert _leaves_equal(got, params)


def test_a_dict_where_the_checkpoint_holds_an_nnx_state_names_both_forms(tmp_path: Path) -> None:
    from nnxmodels import Net

    state = nnx.state(Net(nnx.Rngs(0)))
    path = tmp_path / "m.safetensors"
    tg.save(path, {"params": state})
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.load(path, like={"params": dict(state)})
    assert ("['params']", "node_type") in [(m.path, m.kind) for m in info.value.mismatches]
    assert str(info.value).splitlines()[-1] == (
        "hint: ['params'] is an nnx State in the checkpoint and a dict in `like`: an nnx State "
        "keeps its nested parts as dicts, so a part of one loads with subtree= into "
        "like=state[...] (itself an nnx State) and a whole one into nnx.state(model); pass "
        "`like` in the form the checkpoint was saved from"
    )


def test_subtree_and_ignore_select_parts_of_an_equinox_module(tmp_path: Path) -> None:
    import equinox as eqx
    from nnxmodels import eqx_net

    params = eqx.filter(eqx_net(jax.random.key(0), head=True), eqx.is_array)
    path = tmp_path / "e.safetensors"
    tg.save(path, params)
    enc = tg.load(path, like=params.encoder, subtree=".encoder")
    assert type(enc) is type(params.encoder) and _leaves_equal(enc, params.encoder)
    # an ignored field comes back as None, the equinox form of a part left out
    like = eqx.tree_at(lambda m: m.head, params, None)
    got = tg.load(path, like=like, ignore=[".head"])
    assert type(got) is type(params) and got.head is None
    assert _leaves_equal(got, like)


class _Bag:
    """A registered node whose entries vary per instance, its keys its static
    data (as an nnx State's): what ``ignore=`` leaves of one is compared."""

    def __init__(self, **items: Any) -> None:
        self.items = items


jax.tree_util.register_pytree_with_keys(
    _Bag,
    lambda b: (
        [(jax.tree_util.GetAttrKey(k), b.items[k]) for k in sorted(b.items)],
        tuple(sorted(b.items)),
    ),
    lambda keys, kids: _Bag(**dict(zip(keys, kids))),
)


def test_an_ignored_entry_may_be_none_in_like_and_no_other_may(tmp_path: Path) -> None:
    one = np.ones(1, np.float32)
    path = tmp_path / "bag.safetensors"
    tg.save(path, _Bag(a=one, b=one, c=one))
    got = tg.load(path, like=_Bag(a=one, b=None, c=one), ignore=[".b"])
    assert got.items == {"a": one, "b": None, "c": one}
    assert tg.load(path, like=_Bag(a=one, c=one), ignore=[".b"]).items == {"a": one, "c": one}
    with pytest.raises(tg.TreeMismatchError) as info:  # .d was never stored, nor ignored
        tg.load(path, like=_Bag(a=one, c=one, d=None), ignore=[".b"])
    assert [(m.path, m.kind) for m in info.value.mismatches] == [(".d", "missing")]


_names = st.sampled_from(["a", "b", "enc", "head", "w"])
_trees = st.recursive(
    st.integers(1, 3).map(lambda n: np.arange(n, dtype=np.float32)),
    lambda kids: st.dictionaries(_names, kids, min_size=1, max_size=3),
    max_leaves=8,
)


def _parts(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if not isinstance(tree, dict):
        return []
    return [path] + [p for k, v in tree.items() for p in _parts(v, (*path, k))]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=_trees.filter(lambda t: isinstance(t, dict)), data=st.data())
def test_every_part_of_an_nnx_state_loads_into_its_state(
    tmp_path: Path, tree: Any, data: Any
) -> None:
    """Property: any container of a saved nnx State (stored as a dict) loads
    with subtree= into the State that ``state[...]`` gives, with its values;
    with ignore= of any one entry, into the State without it."""
    state = nnx.State(tree)
    path = tmp_path / "s.safetensors"
    tg.save(path, state)
    part = data.draw(st.sampled_from(_parts(tree)))
    like = state
    for k in part:
        like = like[k]
    text = "".join(f"['{k}']" for k in part)
    got = tg.load(path, like=like, subtree=text or None)
    assert type(got) is nnx.State and _leaves_equal(got, like)
    inner = tree
    for k in part:
        inner = inner[k]
    if len(inner) > 1:
        gone = data.draw(st.sampled_from(sorted(inner)))
        rest = nnx.State({k: v for k, v in inner.items() if k != gone})
        got = tg.load(path, like=rest, subtree=text or None, ignore=[f"{text}['{gone}']"])
        assert type(got) is nnx.State and _leaves_equal(got, rest)
