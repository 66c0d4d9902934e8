"""Checkpoints: round trips, the contract checked before data, migrations, atomic writes."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner
from corpus import CORPUS, Pair, seed_params
from forge import forge

from treeguard import (
    FormatError,
    IntegrityError,
    InvalidTreeError,
    LeafSpec,
    TreeMismatchError,
    TreeSpec,
    environment,
    load,
    mismatches,
    read_header,
    save,
    spec_of,
    verify_file,
)
from treeguard._cli.main import main


def _leaves_equal(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype
        and np.asarray(x).shape == np.asarray(y).shape
        and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(la, lb)
    )


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# -- round trips -----------------------------------------------------------


@pytest.mark.parametrize(("name", "factory"), CORPUS, ids=[n for n, _ in CORPUS])
def test_round_trip_with_like_keeps_exact_structure(
    tmp_path: Path, name: str, factory: Any
) -> None:
    tree = factory()
    path = tmp_path / "c.safetensors"
    save(path, tree, metadata={"case": name})
    out = load(path, like=tree)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    assert _leaves_equal(out, tree)
    assert mismatches(out, tree) == []  # dtypes, shapes and weak types too
    for got, ref in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
        assert type(got) is type(ref) or (isinstance(ref, jax.Array) and isinstance(got, jax.Array))
    assert read_header(path).metadata == {"case": name}


@pytest.mark.parametrize(("name", "factory"), CORPUS, ids=[n for n, _ in CORPUS])
def test_every_file_opens_with_safetensors_numpy(tmp_path: Path, name: str, factory: Any) -> None:
    tree = factory()
    path = tmp_path / "c.safetensors"
    save(path, tree)
    tensors = safetensors.numpy.load_file(path)
    spec = spec_of(tree)
    assert sorted(tensors) == sorted(leaf.path for leaf in spec.leaves)
    for leaf in spec.leaves:
        ref = np.asarray(jax.tree.leaves(tree)[spec.leaves.index(leaf)])
        assert tensors[leaf.path].tobytes() == ref.tobytes()


@pytest.mark.parametrize(("name", "factory"), CORPUS, ids=[n for n, _ in CORPUS])
def test_round_trip_without_like_rebuilds_plain_containers(
    tmp_path: Path, name: str, factory: Any
) -> None:
    tree = factory()
    path = tmp_path / "c.safetensors"
    save(path, tree)
    out = load(path)
    spec = spec_of(tree)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(out))
    if all(n.kind in ("dict", "list", "tuple", "none", "leaf") for n in _nodes(spec.structure)):
        assert jax.tree.structure(out) == spec.treedef
        assert _leaves_equal(out, tree)
    else:  # custom nodes become dicts, whose keys jax sorts: compare as multisets

        def key(x: Any) -> tuple[str, tuple[int, ...], bytes]:
            a = np.asarray(x)
            return (a.dtype.name, a.shape, a.tobytes())

        assert sorted(map(key, jax.tree.leaves(out))) == sorted(map(key, jax.tree.leaves(tree)))


def _nodes(node: Any) -> list[Any]:
    out = [node]
    for c in node.children:
        out += _nodes(c)
    return out


def test_custom_nodes_without_like_become_dicts_by_attribute(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save(path, Pair(jnp.ones(2), {"inner": jnp.zeros(4)}))
    out = load(path)
    assert set(out) == {"left", "right"}
    assert out["right"]["inner"].shape == (4,)
    point = collections.namedtuple("point", ["x", "y"])
    save(path, point(np.ones(1, np.float32), np.zeros(2, np.float32)))
    assert sorted(load(path)) == ["x", "y"]


def test_ml_dtypes_round_trip_bit_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tree = {}
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "int4", "uint4"):
        dtype = np.dtype(getattr(ml_dtypes, name))
        tree[name] = rng.integers(0, 7, size=(3, 5)).astype(dtype)
    tree["complex128"] = (rng.standard_normal(4) + 1j).astype(np.complex128)
    tree["nan_bf16"] = np.array([np.nan, -0.0, np.inf], ml_dtypes.bfloat16)
    path = tmp_path / "m.safetensors"
    save(path, tree)
    out = load(path, like=tree)
    for k, v in tree.items():
        assert out[k].dtype == v.dtype and out[k].tobytes() == v.tobytes(), k
    raw = safetensors.numpy.load_file(path)  # non-native dtypes open as raw bytes
    assert raw["['bfloat16']"].dtype == ml_dtypes.bfloat16
    assert raw["['float8_e4m3fn']"].dtype == np.uint8
    assert raw["['complex128']"].shape == (4, 16)


def test_zero_d_and_zero_size_and_python_scalars(tmp_path: Path) -> None:
    tree = {"s": 3.5, "i": 7, "b": True, "z": np.zeros((0, 3), np.float32), "d": np.float32(2.0)}
    path = tmp_path / "s.safetensors"
    save(path, tree)
    out = load(path, like=tree)
    assert out == {"s": 3.5, "i": 7, "b": True, "z": out["z"], "d": np.float32(2.0)}
    assert type(out["s"]) is float and type(out["d"]) is np.float32
    assert out["z"].shape == (0, 3)


def test_a_single_array_tree_uses_the_empty_path(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save(path, np.arange(4, dtype=np.int32))
    assert list(safetensors.numpy.load_file(path)) == [""]
    np.testing.assert_array_equal(load(path), np.arange(4))


def test_names_with_dots_slashes_quotes_round_trip(tmp_path: Path) -> None:
    tree = {"a.b": np.ones(1), "c/d": np.zeros(1), "q'u\"ote": np.ones(2), "..": np.ones(3)}
    path = tmp_path / "k.safetensors"
    save(path, tree)
    out = load(path)
    assert sorted(out) == sorted(tree)
    assert out[".."].shape == (3,)


def test_header_records_env_spec_hashes_and_format(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    params = seed_params()
    save(path, params, metadata={"step": 10, "note": "ünïcode"})
    h = read_header(path)
    assert h.format == "treeguard.checkpoint/1"
    assert h.spec == spec_of(params)
    assert list(h.env) == list(environment()) and h.env == environment()
    assert h.env["jax"] == jax.__version__
    assert h.metadata == {"step": 10, "note": "ünïcode"}
    assert all(len(t.digest) == 64 for t in h.tensors)
    # Every __metadata__ value is a string, as safetensors requires.
    raw = json.loads(path.read_bytes()[8 : 8 + h.header_bytes])
    assert all(isinstance(v, str) for v in raw["__metadata__"].values())


def test_environment_lists_versions_backend_and_flags() -> None:
    env = environment()
    assert env["numpy"] == np.__version__
    assert env["backend"] == jax.default_backend()
    assert env["x64"] is False and env["device_count"] == jax.device_count()


def test_metadata_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="JSON"):
        save(tmp_path / "x.safetensors", {"w": np.ones(1)}, metadata={"f": object()})
    assert not (tmp_path / "x.safetensors").exists()


# -- the contract, checked before any data is read ---------------------------


def test_mismatch_is_reported_before_data_is_read(tmp_path: Path) -> None:
    params = seed_params()
    path = tmp_path / "p.safetensors"
    save(path, params)
    size = path.stat().st_size
    _flip(path, size - 1)  # corrupt the data: only a data read would notice
    wrong = {**params, "dense2": {"w": jnp.ones((3, 2)), "b": jnp.zeros(1)}}
    with pytest.raises(TreeMismatchError) as info:
        load(path, like=wrong)
    assert [(m.path, m.kind) for m in info.value.mismatches] == [("['dense2']['w']", "shape")]
    assert "(3, 2) in `like`, (3, 1) in the checkpoint" in str(info.value)
    with pytest.raises(IntegrityError, match="corrupt"):
        load(path, like=params)


def test_sixteen_layers_from_twelve_lists_every_missing_layer(tmp_path: Path) -> None:
    layer = {"w": np.ones((2, 2), np.float32)}
    path = tmp_path / "p.safetensors"
    save(path, {"layers": [layer] * 12})
    with pytest.raises(TreeMismatchError) as info:
        load(path, like={"layers": [layer] * 16})
    found = info.value.mismatches
    assert [m.path for m in found] == [f"['layers'][{i}]" for i in range(12, 16)]
    assert {m.kind for m in found} == {"missing"}


def test_extra_keys_in_the_checkpoint_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"w": np.ones(2), "extra": np.ones(1)})
    with pytest.raises(TreeMismatchError, match=r"\['extra'\]: unexpected"):
        load(path, like={"w": np.ones(2)})


def test_no_silent_dtype_cast(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"w": np.ones(2, np.float32)})
    with pytest.raises(
        TreeMismatchError, match=r"dtype bfloat16 in `like`, float32 in the checkpoint"
    ):
        load(path, like={"w": jnp.ones(2, jnp.bfloat16)})


def test_values_are_matched_by_path_not_position(tmp_path: Path) -> None:
    import equinox as eqx

    class A(eqx.Module):
        first: jax.Array
        second: jax.Array

    class B(eqx.Module):  # same leaves, fields in the other order
        second: jax.Array
        first: jax.Array

    path = tmp_path / "p.safetensors"
    save(path, {"m": A(jnp.zeros(3), jnp.ones(3))})
    with pytest.raises(TreeMismatchError, match="node type"):
        load(path, like={"m": B(jnp.zeros(3), jnp.zeros(3))})
    # Plain dicts in another insertion order load each value at its own key.
    save(path, {"b": np.full(2, 2.0), "a": np.full(2, 1.0)})
    out = load(path, like={"a": np.zeros(2), "b": np.zeros(2)})
    assert out["a"][0] == 1.0 and out["b"][0] == 2.0


def test_like_may_be_a_spec_with_symbols(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"x": np.ones((4, 2), np.float32), "y": np.ones((4,), np.float32)})
    spec = spec_of({"x": LeafSpec(("B", 2), "float32"), "y": LeafSpec(("B",), "float32")})
    assert load(path, like=spec)["x"].shape == (4, 2)
    bad = spec_of({"x": LeafSpec(("B", 2), "float32"), "y": LeafSpec(("B", 1), "float32")})
    with pytest.raises(TreeMismatchError):
        load(path, like=bad)


def test_load_into_nnx_and_equinox_updates_models(tmp_path: Path) -> None:
    import equinox as eqx
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    path = tmp_path / "nnx.safetensors"
    save(path, nnx.state(model))
    fresh = nnx.Linear(2, 3, rngs=nnx.Rngs(1))
    nnx.update(fresh, load(path, like=nnx.state(fresh)))
    np.testing.assert_array_equal(fresh.kernel[...], model.kernel[...])

    lin = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    save(path, lin)
    other = eqx.nn.Linear(2, 3, key=jax.random.key(1))
    out = load(path, like=other)
    assert isinstance(out, eqx.nn.Linear)
    np.testing.assert_array_equal(out.weight, lin.weight)


# -- migrations ----------------------------------------------------------------


def test_rename_moves_a_subtree_on_purpose(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    old = {"dense_2": {"w": np.ones((3, 1), np.float32), "b": np.zeros(1, np.float32)}}
    save(path, old)
    like = {"dense2": {"w": np.zeros((3, 1), np.float32), "b": np.ones(1, np.float32)}}
    with pytest.raises(TreeMismatchError, match="did you mean"):
        load(path, like=like)
    out = load(path, like=like, rename={"['dense_2']": "['dense2']"})
    assert out["dense2"]["w"][0, 0] == 1.0 and out["dense2"]["b"][0] == 0.0
    with pytest.raises(ValueError, match="names no leaf"):
        load(path, like=like, rename={"['nope']": "['dense2']"})
    with pytest.raises(ValueError, match="need `like`"):
        load(path, rename={"['dense_2']": "['dense2']"})


def test_rename_still_checks_shapes(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"old": np.ones(3, np.float32)})
    with pytest.raises(TreeMismatchError, match=r"\['new'\]: shape \(4,\) in `like`, \(3,\)"):
        load(path, like={"new": np.ones(4, np.float32)}, rename={"['old']": "['new']"})


def test_allow_missing_keeps_like_values_only_where_named(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"enc": np.ones(2, np.float32)})
    like = {"enc": np.zeros(2, np.float32), "head": {"w": np.full(3, 5.0, np.float32)}}
    with pytest.raises(TreeMismatchError, match=r"\['head'\]: missing"):
        load(path, like=like)
    out = load(path, like=like, allow_missing=["['head']"])
    assert out["enc"][0] == 1.0 and out["head"]["w"][0] == 5.0
    with pytest.raises(ValueError, match="names no leaf"):
        load(path, like=like, allow_missing=["['tail']"])
    with pytest.raises(ValueError, match="holds no value"):
        load(path, like=spec_of(like), allow_missing=["['head']"])


# -- atomic writes ------------------------------------------------------------


def test_failed_save_leaves_previous_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"w": np.ones(2)})
    before = path.read_bytes()
    with pytest.raises(InvalidTreeError, match="not an array"):
        save(path, {"w": np.ones(2), "name": "text"})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["p.safetensors"]


def test_stale_temps_of_dead_savers_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(dead.stdout)
    stale = tmp_path / f".p.safetensors.{pid}.0123abcd.tmp"
    stale.write_bytes(b"partial")
    live = tmp_path / f".p.safetensors.{os.getpid()}.89abcdef.tmp"
    live.write_bytes(b"in progress")
    save(tmp_path / "p.safetensors", {"w": np.ones(1)})
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, "p.safetensors"])


def test_file_mode_follows_umask(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"w": np.ones(1)})
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# -- specs from files ---------------------------------------------------------


def test_a_contract_is_read_from_checkpoints_specs_and_foreign_safetensors(tmp_path: Path) -> None:
    params = seed_params()
    ckpt = tmp_path / "c.safetensors"
    save(ckpt, params)
    spec_json = tmp_path / "s.json"
    spec_of(params).save(spec_json)
    foreign = tmp_path / "f.safetensors"
    safetensors.numpy.save_file({"model.w": np.ones((2, 2), np.float16)}, str(foreign))
    foreign_json = tmp_path / "f.json"
    spec_of({"model.w": LeafSpec((2, 2), "float16")}).save(foreign_json)
    for expected, actual in ((spec_json, ckpt), (ckpt, spec_json), (foreign_json, foreign)):
        res = CliRunner().invoke(main, ["diff", str(expected), str(actual)])
        assert res.exit_code == 0 and res.output.startswith("match: "), res.output
    res = CliRunner().invoke(main, ["diff", str(spec_json), str(foreign)])
    assert res.exit_code == 1 and "unexpected: f16[2,2]" in res.output, res.output
    with pytest.raises(FormatError, match="treeguard did not write: it holds no hashes"):
        load(foreign)


def test_verify_file_checks_hashes_and_contract(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    params = seed_params()
    save(path, params)
    seen: list[tuple[int, int]] = []
    h = verify_file(path, like=params, progress=lambda d, t: seen.append((d, t)))
    assert h.spec.num_leaves == 4 and seen[-1][0] == seen[-1][1] == h.data_bytes
    with pytest.raises(TreeMismatchError):
        verify_file(path, like={"w": jnp.ones(1)})
    _flip(path, h.data_start + h.tensors[2].begin)
    with pytest.raises(IntegrityError) as info:
        verify_file(path)
    assert info.value.path == h.tensors[2].name
    assert h.tensors[2].name in str(info.value) and "hint:" in str(info.value)


def test_spec_treedef_for_plain_stored_tree(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"a": [np.ones(1), (np.zeros(2),)], "n": None})
    out = load(path)
    assert jax.tree.structure(out) == read_header(path).spec.treedef
    assert isinstance(out["a"][1], tuple) and out["n"] is None


# -- sharded arrays over 8 simulated devices ----------------------------------

_SHARDED = textwrap.dedent(
    """
    import os, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from treeguard import save, load, read_header
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    w = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", "model")))
    b = jax.device_put(jnp.arange(8, dtype=jnp.bfloat16), NamedSharding(mesh, P("model")))
    r = jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))
    tree = {"w": w, "b": b, "r": r}
    path = sys.argv[1]
    save(path, tree)
    assert read_header(path).env["device_count"] == 8
    like = jax.tree.map(jnp.zeros_like, tree)
    out = load(path, like=like)
    for k in tree:
        assert out[k].sharding == tree[k].sharding, (k, out[k].sharding)
        assert np.array_equal(np.asarray(out[k]), np.asarray(tree[k])), k
    plain = load(path)
    assert np.array_equal(plain["w"], np.arange(64.0).reshape(8, 8))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    out2 = load(path, like=abstract)
    assert out2["w"].sharding == w.sharding
    print("ok")
    """
)


@pytest.mark.slow
def test_sharded_arrays_over_eight_devices(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    res = subprocess.run(
        [sys.executable, "-c", _SHARDED, str(tmp_path / "s.safetensors")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_tree_spec_from_json_round_trip_via_header(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    tree = {"a": jnp.ones((2, 3), jnp.bfloat16)}
    save(path, tree)
    spec = read_header(path).spec
    assert TreeSpec.from_json(spec.to_json()) == spec == spec_of(tree)


def test_metadata_error_names_the_bad_key(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"metadata\['run'\]\['tags'\]\[1\]: .*set") as info:
        save(tmp_path / "x.safetensors", {"w": np.ones(1)}, metadata={"run": {"tags": [1, {2}]}})
    assert "hint:" in str(info.value)
    with pytest.raises(TypeError, match=r"metadata\[3\]: keys must be str"):
        save(tmp_path / "x.safetensors", {"w": np.ones(1)}, metadata={3: "x"})  # type: ignore[dict-item]
    assert os.listdir(tmp_path) == []


def test_save_onto_a_directory_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        save(target, {"w": np.ones(3, np.float32)})
    assert os.listdir(tmp_path) == ["model.safetensors"] and target.is_dir()
    assert os.listdir(target) == []


def test_a_bad_spec_inside_a_header_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save(path, {"w": np.ones(3, np.float32)})
    forge(
        path,
        lambda meta, table: meta.update({"treeguard.spec": json.dumps({"format": "not-a-spec"})}),
    )
    with pytest.raises(FormatError, match=f"^{re.escape(str(path))}: treeguard.spec: ") as info:
        read_header(path)
    assert isinstance(info.value.__cause__, FormatError)


def test_a_weak_typed_array_comes_back_weak_typed(tmp_path: Path) -> None:
    # JAX has no direct way to make a weakly typed array of given values: the loader
    # compiles an identity for a weakly typed argument, and this fails loudly if a JAX
    # release stops giving the weak type that way.
    import jax.numpy as jnp

    tree = {
        "vector": jnp.where(jnp.array([True, False, True]), 1.5, 2.5),
        "ints": jnp.broadcast_to(jnp.asarray(7), (2, 2)),
        "strong": jnp.ones(3),
    }
    assert tree["vector"].weak_type and tree["ints"].weak_type and not tree["strong"].weak_type
    save(tmp_path / "w.safetensors", tree)
    out = load(tmp_path / "w.safetensors", like=tree)
    assert out["vector"].weak_type and out["ints"].weak_type and not out["strong"].weak_type
    assert out["vector"].tolist() == [1.5, 2.5, 1.5]
    assert out["ints"].dtype == jnp.int32 and out["ints"].tolist() == [[7, 7], [7, 7]]
    assert out["vector"].sharding == tree["vector"].sharding
