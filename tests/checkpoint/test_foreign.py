"""Foreign safetensors files (written by another tool) loaded by name into a tree."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import treeguard as tg

DATA = Path(__file__).parents[1] / "data"
#: A real model file from the chess-cv wheel on PyPI (see tests/data/README.md).
CHESS = DATA / "chess_cv_pieces.safetensors"


def _chess_like() -> dict[str, Any]:
    shapes = {
        "conv1": (16, 3, 3, 3),
        "conv2": (32, 3, 3, 16),
        "conv3": (64, 3, 3, 32),
        "fc1": (128, 1024),
        "fc2": (13, 128),
    }
    return {
        k: {"weight": np.zeros(s, np.float32), "bias": np.zeros(s[0], np.float32)}
        for k, s in shapes.items()
    }


def _raw(path: Path, table: dict[str, Any], data: bytes, meta: Any = None) -> Path:
    doc = dict(table)
    if meta is not None:
        doc["__metadata__"] = meta
    header = json.dumps(doc).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def _hf(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A Hugging Face style file, written by safetensors itself."""
    arrays = {
        "encoder.layer.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "encoder.layer.0.bias": np.ones(3, np.float32),
        "encoder.layer.1.weight": np.full((3, 3), 2, ml_dtypes.bfloat16),
        "head.scale": np.array(0.5, np.float16),
    }
    path = tmp_path / "hf.safetensors"
    safetensors.numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    return path, arrays


def _hf_like() -> dict[str, Any]:
    return {
        "encoder": {
            "layer": [
                {"weight": jnp.zeros((3, 4)), "bias": jnp.zeros(3)},
                {"weight": jnp.zeros((3, 3), jnp.bfloat16)},
            ]
        },
        "head": {"scale": np.float16(0)},
    }


# -- the real file -------------------------------------------------------------------


def test_real_file_refused_by_default_then_loaded_by_name() -> None:
    with pytest.raises(tg.FormatError) as e:
        tg.load(CHESS, like=_chess_like(), names="dotted")
    assert "holds no hashes" in str(e.value)
    assert 'unverified="allow"' in str(e.value)
    got = tg.load(CHESS, like=_chess_like(), names="dotted", unverified="allow")
    ref = safetensors.numpy.load_file(str(CHESS))
    for layer, leaves in got.items():
        for leaf, arr in leaves.items():
            np.testing.assert_array_equal(arr, ref[f"{layer}.{leaf}"])
    assert tg.spec_of(got) == tg.spec_of(_chess_like())


def test_warn_mode_names_the_file_and_allow_is_silent() -> None:
    with pytest.warns(tg.UnverifiedWeightsWarning, match="chess_cv_pieces.safetensors") as rec:
        tg.load(CHESS, like=_chess_like(), names="dotted", unverified="warn")
    ours = [w for w in rec if issubclass(w.category, tg.UnverifiedWeightsWarning)]
    assert len(ours) == 1
    assert ours[0].filename == __file__  # points at the caller's line
    assert "hash" in str(ours[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tg.load(CHESS, like=_chess_like(), names="dotted", unverified="allow")


def test_bad_unverified_value() -> None:
    with pytest.raises(ValueError, match="unverified must be"):
        tg.load(CHESS, like=_chess_like(), names="dotted", unverified="yes")  # type: ignore[arg-type]


# -- names ---------------------------------------------------------------------------


def test_dotted_into_lists_and_scalars(tmp_path: Path) -> None:
    path, arrays = _hf(tmp_path)
    out = tg.load(path, like=_hf_like(), names="dotted", unverified="allow")
    np.testing.assert_array_equal(
        out["encoder"]["layer"][0]["weight"], arrays["encoder.layer.0.weight"]
    )
    assert out["encoder"]["layer"][1]["weight"].dtype == jnp.bfloat16
    assert isinstance(out["encoder"]["layer"][0]["bias"], type(jnp.zeros(1)))
    assert isinstance(out["head"]["scale"], np.float16)


@pytest.mark.parametrize(
    ("names", "sep"),
    [("slashed", "/"), ("keypath", None), (lambda keys: "model::" + "::".join(map(str, keys)), "")],
    ids=["slashed", "keypath", "function"],
)
def test_other_rules(tmp_path: Path, names: Any, sep: str | None) -> None:
    like = {"a": {"b": [np.zeros(2, np.float32)]}}
    name = {"/": "a/b/0", None: "['a']['b'][0]", "": "model::a::b::0"}[sep]
    path = tmp_path / "f.safetensors"
    safetensors.numpy.save_file({name: np.arange(2, dtype=np.float32)}, str(path))
    out = tg.load(path, like=like, names=names, unverified="allow")
    np.testing.assert_array_equal(out["a"]["b"][0], [0, 1])


def test_every_mismatch_listed_with_near_miss_hint(tmp_path: Path) -> None:
    path, _ = _hf(tmp_path)
    like = _hf_like()
    like["encoder"]["layer"][0]["weight"] = jnp.zeros((4, 3))
    like["encoder"]["layer"][1]["weight"] = jnp.zeros((3, 3))
    like["head"] = {"scal": np.float16(0)}
    with pytest.raises(tg.TreeMismatchError) as e:
        tg.load(path, like=like, names="dotted", unverified="allow")
    kinds = sorted((m.path, m.kind) for m in e.value.mismatches)
    assert kinds == [
        ("'head.scale'", "unexpected"),
        ("['encoder']['layer'][0]['weight']", "shape"),
        ("['encoder']['layer'][1]['weight']", "dtype"),
        ("['head']['scal']", "missing"),
    ]
    text = str(e.value)
    assert "names='dotted'" in text
    assert "did you mean 'head.scale'?" in text
    assert "f16[] as tensor 'head.scal'" in text


def test_wrong_rule_hint(tmp_path: Path) -> None:
    path, _ = _hf(tmp_path)
    with pytest.raises(tg.TreeMismatchError, match="look dotted .*pass names='dotted'"):
        tg.load(path, like=_hf_like(), unverified="allow")


def _bytes_read() -> int:
    """Bytes this process has read through read/pread so far (Linux)."""
    with open("/proc/self/io") as f:
        found = [line for line in f if line.startswith("rchar:")]
    if not found:  # gVisor's /proc (the TPU machine's) counts no bytes read
        pytest.skip("this kernel's /proc/self/io has no rchar to count bytes read with")
    return int(found[0].split()[1])


def test_mismatch_before_any_read(tmp_path: Path) -> None:
    """The contract fails before a byte of tensor data is read; a match reads them all."""
    n = 16 << 20
    arrays = {"a": np.zeros(n, np.float32), "b": np.zeros(2, np.float32)}
    path = tmp_path / "big.safetensors"
    safetensors.numpy.save_file(arrays, str(path))
    like = {"a": np.zeros(n, np.float32), "b": np.zeros(3, np.float32)}
    before = _bytes_read()
    with pytest.raises(tg.TreeMismatchError, match="shape"):
        tg.load(path, like=like, names="flat", unverified="allow")
    assert _bytes_read() - before < n  # a quarter of the data: other threads may read a little
    like["b"] = np.zeros(2, np.float32)
    before = _bytes_read()
    tg.load(path, like=like, names="flat", unverified="allow")
    assert _bytes_read() - before >= 4 * n


def test_rename_and_allow_missing(tmp_path: Path) -> None:
    path, arrays = _hf(tmp_path)
    like = _hf_like()
    like = {"enc": like["encoder"], "head": like["head"], "extra": np.ones(2, np.float32)}
    out = tg.load(
        path,
        like=like,
        names="dotted",
        rename={"['encoder']": "['enc']"},
        allow_missing=["['extra']"],
        unverified="allow",
    )
    np.testing.assert_array_equal(out["enc"]["layer"][0]["bias"], arrays["encoder.layer.0.bias"])
    np.testing.assert_array_equal(out["extra"], [1, 1])
    with pytest.raises(ValueError, match="names no leaf"):
        tg.load(path, like=like, names="dotted", rename={"['x']": "['nope']"}, unverified="allow")


def test_two_leaves_one_name(tmp_path: Path) -> None:
    path, _ = _hf(tmp_path)
    like = {"a.b": np.zeros(1), "a": {"b": np.zeros(1)}}
    with pytest.raises(ValueError, match="both read tensor 'a.b'"):
        tg.load(path, like=like, names="dotted", unverified="allow")


def test_like_none_nests_by_name(tmp_path: Path) -> None:
    path, arrays = _hf(tmp_path)
    out = tg.load(path, names="dotted", unverified="allow")
    assert set(out["encoder"]["layer"]) == {"0", "1"}  # numeric components stay str keys
    np.testing.assert_array_equal(
        out["encoder"]["layer"]["1"]["weight"], arrays["encoder.layer.1.weight"]
    )


def test_expect_digest_refuses_foreign(tmp_path: Path) -> None:
    path, _ = _hf(tmp_path)
    with pytest.raises(tg.IntegrityError, match="no treeguard digest"):
        tg.load(path, like=_hf_like(), names="dotted", unverified="allow", expect_digest="0" * 64)


# -- hostile headers -------------------------------------------------------------------


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize(
    ("table", "data", "meta", "message"),
    [
        ({"w": _entry("<F4", [1], 0, 4)}, b"\0" * 4, None, "unknown dtype '<F4'"),
        ({"w": _entry(">f4", [1], 0, 4)}, b"\0" * 4, None, "unknown dtype '>f4'"),
        ({"w": _entry("F4", [2], 0, 1)}, b"\0", None, "packs several values"),
        ({"w": _entry("F32", [3], 0, 8)}, b"\0" * 8, None, "needs 12 bytes"),
        ({"w": _entry("F32", [2**40, 2**22], 0, 8)}, b"\0" * 8, None, "needs"),
        ({"w": _entry("F32", [-1], 0, 4)}, b"\0" * 4, None, "shape must be"),
        ({"w": _entry("F32", [1], 4, 0)}, b"\0" * 4, None, "run backwards"),
        ({"w": _entry("F32", [1], 0, 4)}, b"\0" * 8, None, "cover 4 bytes but the file holds 8"),
        ({"w": _entry("F32", [1], 0, 4)}, b"", None, "cover 4 bytes but the file holds 0"),
        (
            {"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [1], 4, 8)},
            b"\0" * 8,
            None,
            "overlaps",
        ),
        (
            {"a": _entry("F32", [1], 0, 4), "b": _entry("F32", [1], 8, 12)},
            b"\0" * 12,
            None,
            "gap",
        ),
        ({"w": {**_entry("F32", [1], 0, 4), "x": 1}}, b"\0" * 4, None, "exactly dtype"),
        ({"w": _entry("BF16", [1], 0, 2)}, b"\0" * 2, {"k": 1}, "__metadata__ must be"),
        ({"w": [1, 2]}, b"", None, "exactly dtype"),
        ({"w": _entry("F32", [1] * 65, 0, 4)}, b"\0" * 4, None, "at most 64"),
    ],
    ids=[
        "byte-order-prefix",
        "numpy-dtype",
        "packed-f4",
        "size-vs-shape",
        "huge-shape",
        "negative-dim",
        "backwards",
        "extended",
        "truncated",
        "overlap",
        "gap",
        "extra-field",
        "metadata-not-str",
        "entry-not-object",
        "too-many-dims",
    ],
)
def test_hostile_header(tmp_path: Path, table: Any, data: bytes, meta: Any, message: str) -> None:
    path = _raw(tmp_path / "h.safetensors", table, data, meta)
    with pytest.raises(tg.FormatError, match=message):
        tg.load(path, like={"w": np.zeros(1, np.float32)}, unverified="allow")


def test_float8_and_bf16_read_bit_exact(tmp_path: Path) -> None:
    x = np.arange(-8, 8, dtype=np.float32)
    arrays = {
        "f8": x.astype(ml_dtypes.float8_e4m3fn),
        "e5": x.astype(ml_dtypes.float8_e5m2),
        "bf": x.astype(ml_dtypes.bfloat16),
    }
    path = tmp_path / "f8.safetensors"
    safetensors.numpy.save_file(arrays, str(path))
    like = {k: np.zeros_like(v) for k, v in arrays.items()}
    out = tg.load(path, like=like, names="flat", unverified="allow")
    for k, v in arrays.items():
        assert out[k].dtype == v.dtype
        assert out[k].tobytes() == v.tobytes()


def test_nesting_refusals(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    safetensors.numpy.save_file({"a": np.zeros(1), "a.b": np.zeros(1)}, str(path))
    with pytest.raises(tg.FormatError, match="both a tensor and a group"):
        tg.load(path, names="dotted", unverified="allow")
    safetensors.numpy.save_file({"a..b": np.zeros(1)}, str(path))
    with pytest.raises(tg.FormatError, match="empty component"):
        tg.load(path, names="dotted", unverified="allow")
    assert set(tg.load(path, names="flat", unverified="allow")) == {"a..b"}
    safetensors.numpy.save_file({".".join(["x"] * 200): np.zeros(1)}, str(path))
    with pytest.raises(tg.FormatError, match="200 levels deep"):
        tg.load(path, names="dotted", unverified="allow")


# -- every truncation and flips of the real file's header ------------------------------------


def test_truncated_and_flipped_headers_of_the_real_file(tmp_path: Path) -> None:
    raw = CHESS.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    like = _chess_like()
    path = tmp_path / "x.safetensors"
    rng = np.random.default_rng(0)
    cuts = [*range(0, 16), *rng.choice(range(16, 8 + n + 2), size=80, replace=False)]
    for cut in [*cuts, 8 + n, 8 + n + 1, len(raw) - 1]:
        path.write_bytes(raw[:cut])
        with pytest.raises(tg.FormatError):
            tg.load(path, like=like, names="dotted", unverified="allow")
    for pos in rng.choice(8 + n, size=120, replace=False):
        flipped = bytearray(raw)
        flipped[pos] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(flipped))
        try:
            out = tg.load(path, like=like, names="dotted", unverified="allow")
        except (tg.FormatError, tg.TreeMismatchError):
            continue
        # A flip that still parses (whitespace, a name's letter) leaves a consistent file.
        assert tg.spec_of(out) == tg.spec_of(like)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(
            st.characters(blacklist_characters="./", blacklist_categories=["Cs"]),
            min_size=1,
            max_size=6,
        ),
        st.dictionaries(
            st.text("abc_0123456789", min_size=1, max_size=4),
            st.integers(0, 3),
            min_size=1,
            max_size=3,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_dotted_names_nest_back(tree: dict[str, dict[str, int]]) -> None:
    import tempfile

    flat = {
        f"{a}.{b}": np.full(size, 1, np.float32)
        for a, inner in tree.items()
        for b, size in inner.items()
    }
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.safetensors"
        safetensors.numpy.save_file(flat, str(path))
        out = tg.read_foreign(path)
    assert {a: {b: v.shape[0] for b, v in inner.items()} for a, inner in out.items()} == tree


def test_extra_tensors_are_unexpected(tmp_path: Path) -> None:
    path, _ = _hf(tmp_path)
    like = _hf_like()
    del like["head"]
    with pytest.raises(tg.TreeMismatchError, match="no leaf of `like` reads") as e:
        tg.load(path, like=like, names="dotted", unverified="allow")
    assert [(m.path, m.kind) for m in e.value.mismatches] == [("'head.scale'", "unexpected")]
