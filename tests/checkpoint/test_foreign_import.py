"""``treeguard import`` and ``import_weights``: safetensors, .npz, flax msgpack and
orbax sources into verified checkpoints; ``ckpt inspect``/``verify`` of foreign files."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import blake3
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner

import treeguard as tg
from treeguard._cli.main import main

CHESS = Path(__file__).parents[1] / "data" / "chess_cv_pieces.safetensors"


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _chess_like() -> dict[str, Any]:
    shapes = {"conv1": 3, "conv2": 16, "conv3": 32}
    like: dict[str, Any] = {
        k: {"weight": jnp.zeros((o, 3, 3, i)), "bias": jnp.zeros(o)}
        for (k, i), o in zip(shapes.items(), (16, 32, 64))
    }
    like["fc1"] = {"weight": jnp.zeros((128, 1024)), "bias": jnp.zeros(128)}
    like["fc2"] = {"weight": jnp.zeros((13, 128)), "bias": jnp.zeros(13)}
    return like


# -- the real third-party file, end to end ---------------------------------------------


@pytest.mark.slow
def test_real_file_import_verify_load(tmp_path: Path) -> None:
    dst = tmp_path / "chess.safetensors"
    res = _run("import", str(CHESS), str(dst))
    assert res.exit_code == 0, res.output
    assert "10 tensors, 156,461 params" in res.output
    res = _run("ckpt", "verify", str(dst))
    assert res.exit_code == 0, res.output
    assert "every blake3 matches" in res.output
    h = tg.read_header(dst)
    source = h.metadata["imported_from"]
    assert source["format"] == "safetensors" and source["names"] == "dotted"
    assert source["blake3"] == blake3.blake3(CHESS.read_bytes()).hexdigest()
    assert h.hash_name == "blake3"
    # The imported checkpoint is verified and loads by key path into the model's tree.
    params = tg.load(dst, like=_chess_like())
    ref = safetensors.numpy.load_file(str(CHESS))
    np.testing.assert_array_equal(np.asarray(params["fc1"]["weight"]), ref["fc1.weight"])
    # The network runs on it: NHWC convolutions with MLX's OHWI kernels.
    x = jnp.ones((1, 32, 32, 3))
    for layer in ("conv1", "conv2", "conv3"):
        w = jnp.transpose(params[layer]["weight"], (1, 2, 3, 0))
        x = jnp.maximum(jax_conv(x, w) + params[layer]["bias"], 0)
        x = x.reshape(1, x.shape[1] // 2, 2, x.shape[2] // 2, 2, -1).max(axis=(2, 4))
    logits = params["fc2"]["weight"] @ jnp.maximum(
        params["fc1"]["weight"] @ x.reshape(-1) + params["fc1"]["bias"], 0
    )
    assert logits.shape == (13,) and bool(jnp.isfinite(logits).all())


def jax_conv(x: Any, w: Any) -> Any:
    import jax

    return jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def test_import_with_like_spec(tmp_path: Path) -> None:
    spec = tmp_path / "chess.spec.json"
    tg.spec_of(_chess_like()).save(spec)
    dst = tmp_path / "c.safetensors"
    res = _run("import", str(CHESS), str(dst), "--like", str(spec))
    assert res.exit_code == 0, res.output
    assert f"matches {spec}" in res.output
    assert tg.read_header(dst).spec == tg.spec_of(_chess_like())
    bad = _chess_like()
    bad["fc2"]["weight"] = jnp.zeros((10, 128))
    bad["head"] = bad.pop("fc1")
    tg.spec_of(bad).save(spec)
    res = _run("import", str(CHESS), str(tmp_path / "d.safetensors"), "--like", str(spec))
    assert res.exit_code == 1, res.output
    assert "['fc2']['weight']: shape (10, 128) in" in res.output
    assert "['head']['weight']: missing" in res.output
    assert "'fc1.weight': unexpected" in res.output
    assert not (tmp_path / "d.safetensors").exists()


def test_import_bad_input_exits_2(tmp_path: Path) -> None:
    pkl = tmp_path / "model.bin"
    pkl.write_bytes(pickle.dumps({"w": [1.0]}, protocol=4))
    res = _run("import", str(pkl), str(tmp_path / "o.safetensors"))
    assert res.exit_code == 2 and "never unpickles" in res.output
    link = tmp_path / "link.safetensors"
    link.symlink_to(CHESS)
    res = _run("import", str(link), str(tmp_path / "o.safetensors"))
    assert res.exit_code == 2 and "symbolic link" in res.output
    res = _run("import", str(tmp_path / "nothing"), str(tmp_path / "o.safetensors"))
    assert res.exit_code == 2


def test_keypath_and_slashed_names(tmp_path: Path) -> None:
    src = tmp_path / "k.safetensors"
    safetensors.numpy.save_file(
        {"['a'][0]": np.ones(2, np.float32), "['a'][1]": np.zeros(2, np.float32)}, str(src)
    )
    tree = tg.read_foreign(src, names="keypath")
    assert isinstance(tree["a"], list) and len(tree["a"]) == 2
    safetensors.numpy.save_file({"enc/l/w": np.ones(2, np.float32)}, str(src))
    res = _run("import", str(src), str(tmp_path / "o.safetensors"), "--names", "slashed")
    assert res.exit_code == 0, res.output
    assert tg.read_header(tmp_path / "o.safetensors").spec.leaves[0].path == "['enc']['l']['w']"


# -- .npz -------------------------------------------------------------------------------


def test_npz_import(tmp_path: Path) -> None:
    src = tmp_path / "w.npz"
    np.savez_compressed(
        src,
        **{"dense.w": np.arange(6, dtype=np.float32).reshape(2, 3), "dense.b": np.ones(3, ">f4")},
    )
    h = tg.import_weights(src, tmp_path / "w.safetensors")
    assert h.metadata["imported_from"]["format"] == "npz"
    out = tg.load(tmp_path / "w.safetensors")
    assert out["dense"]["b"].dtype == np.float32 and out["dense"]["b"].dtype.isnative
    np.testing.assert_array_equal(out["dense"]["w"], np.arange(6).reshape(2, 3))


def _zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def test_npz_refusals(tmp_path: Path) -> None:
    obj = _zip(tmp_path / "o.npz", {"w.npy": _npy(np.array([{"x": 1}], dtype=object))})
    with pytest.raises(tg.FormatError, match="need pickle"):
        tg.read_foreign(obj)
    torch_like = _zip(tmp_path / "t.npz", {"archive/data.pkl": pickle.dumps([1])})
    with pytest.raises(tg.FormatError, match="not an .npy array"):
        tg.read_foreign(torch_like)
    strings = _zip(tmp_path / "s.npz", {"w.npy": _npy(np.array(["a"]))})
    with pytest.raises(tg.FormatError, match="not a numeric dtype"):
        tg.read_foreign(strings)
    # A header claiming far more elements than the member holds: refused before allocating.
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)}
    )
    lie = _zip(tmp_path / "l.npz", {"w.npy": buf.getvalue() + bytes(16)})
    with pytest.raises(tg.FormatError, match="needs 4,000,000,000,000 bytes, the member holds 16"):
        tg.read_foreign(lie)
    # A member whose size in the central directory exceeds the whole archive.
    stored = _zip(tmp_path / "z.npz", {"w.npy": _npy(np.zeros(4, np.float32))})
    raw = bytearray(stored.read_bytes())
    cd = raw.rindex(b"PK\x01\x02")
    raw[cd + 24 : cd + 28] = (1 << 31).to_bytes(4, "little")
    stored.write_bytes(bytes(raw))
    with pytest.raises(tg.FormatError, match="claims 2,147,483,648 bytes"):
        tg.read_foreign(stored)
    big = _npy(np.zeros(4, np.float32)).replace(b"(4,)", b"(9,)")
    with pytest.raises(tg.FormatError, match="needs 36 bytes, the member holds 16"):
        tg.read_foreign(_zip(tmp_path / "b.npz", {"w.npy": big}))


# -- flax msgpack and orbax -----------------------------------------------------------------


def test_flax_msgpack_import(tmp_path: Path) -> None:
    from flax import serialization

    state = {
        "params": {"Dense_0": {"kernel": np.ones((2, 3), np.float32), "bias": np.zeros(3)}},
        "step": np.int32(7),
        "bf": np.ones(2, ml_dtypes.bfloat16),
    }
    src = tmp_path / "state.msgpack"
    src.write_bytes(serialization.msgpack_serialize(state))
    res = _run("import", str(src), str(tmp_path / "s.safetensors"))
    assert res.exit_code == 0, res.output
    out = tg.load(tmp_path / "s.safetensors")
    assert out["params"]["Dense_0"]["kernel"].shape == (2, 3)
    assert out["step"].dtype == np.int32 and out["step"].shape == ()
    assert out["bf"].dtype == ml_dtypes.bfloat16
    src.write_bytes(serialization.msgpack_serialize({"name": "text"}))
    with pytest.raises(tg.FormatError, match="a str, not an array"):
        tg.read_foreign(src)
    src.write_bytes(b"\x81\xa1a\xc7\x05\x01garbage")
    with pytest.raises(tg.FormatError, match="not a flax msgpack file"):
        tg.read_foreign(src)


def test_orbax_directory_import(tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    tree = {"enc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3, jnp.bfloat16)}, "step": 3}
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(tmp_path / "ck", tree)
    ckptr.wait_until_finished()
    like = {"enc": {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, ml_dtypes.bfloat16)}}
    like["step"] = np.zeros((), np.int64)
    h = tg.import_weights(tmp_path / "ck", tmp_path / "o.safetensors", like=like)
    assert h.metadata["imported_from"]["format"] == "orbax"
    assert "blake3" not in h.metadata["imported_from"]
    out = tg.load(tmp_path / "o.safetensors", like=like)
    np.testing.assert_array_equal(out["enc"]["w"], np.ones((2, 3)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(tg.FormatError, match="not a readable orbax checkpoint"):
        tg.read_foreign(tmp_path / "empty")


# -- ckpt inspect / verify of a foreign file -------------------------------------------------


def test_inspect_foreign(tmp_path: Path) -> None:
    res = _run("ckpt", "inspect", str(CHESS))
    assert res.exit_code == 0, res.output
    assert "not a treeguard checkpoint" in res.output
    assert "fc1.weight" in res.output and "f32[128,1024]" in res.output
    assert "no contract (spec) and no hashes" in res.output
    res = _run("ckpt", "inspect", "--json", str(CHESS))
    doc = json.loads(res.output)
    assert doc["lacks"] == ["contract", "hashes"] and doc["hashes"] is None
    assert doc["num_params"] == 156461
    assert {t["name"]: t["shape"] for t in doc["tensors"]}["conv1.weight"] == [16, 3, 3, 3]


def test_verify_foreign_is_structure_only_exit_3(tmp_path: Path) -> None:
    res = _run("ckpt", "verify", str(CHESS))
    assert res.exit_code == 3, res.output
    assert "structure only" in res.output
    assert "checked: the header" in res.output and "not checked: the bytes" in res.output


def test_inspect_and_verify_hostile_foreign_exit_2(tmp_path: Path) -> None:
    raw = CHESS.read_bytes()
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(raw[:-10])
    for cmd in ("inspect", "verify"):
        res = _run("ckpt", cmd, str(bad))
        assert res.exit_code == 2, res.output
        assert "the tensors cover" in res.output
