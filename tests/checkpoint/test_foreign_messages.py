"""Pinned text of the messages about foreign weights and typed PRNG keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import safetensors.numpy

import treeguard as tg


def _message(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(tg.TreeguardError) as info:
        fn(*args, **kwargs)
    return str(info.value)


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    path = tmp_path / "hf.safetensors"
    safetensors.numpy.save_file(
        {"enc.0.w": np.ones((2, 3), np.float32), "enc.0.b": np.ones(3, np.float32)}, str(path)
    )
    return path


def test_refusal_message(hf: Path) -> None:
    assert _message(tg.load, hf, like={}) == (
        f"{hf}: a safetensors file treeguard did not write: it holds no hashes and no "
        "contract, so nothing in it can be verified\n"
        'hint: pass unverified="allow" to load it knowing that no hash checks it '
        '(unverified="warn" to be warned each time), or turn it into a hashed checkpoint '
        "once with `treeguard import SRC DST` and load that"
    )


def test_warning_message(hf: Path) -> None:
    like = {"enc": [{"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}]}
    with pytest.warns(tg.UnverifiedWeightsWarning) as rec:
        tg.load(hf, like=like, names="dotted", unverified="warn")
    ours = [w for w in rec if issubclass(w.category, tg.UnverifiedWeightsWarning)]
    assert str(ours[0].message) == (
        f"{hf}: loaded without any hash check: the file holds no hashes and no contract "
        "(a safetensors file treeguard did not write); only its header's structure and the "
        "names, shapes and dtypes were checked\n"
        'hint: pass unverified="allow" to load it on purpose without this warning, or turn '
        "it into a hashed checkpoint once with `treeguard import SRC DST`"
    )


def test_mismatch_by_name_message(hf: Path) -> None:
    like = {"enc": [{"w": np.zeros((3, 2), np.float32), "bias": np.zeros(3, np.float32)}]}
    assert _message(tg.load, hf, like=like, names="dotted", unverified="allow") == (
        f"{hf} (tensors named by names='dotted'): 3 mismatches between the file and `like`:\n"
        "  ['enc'][0]['bias']: missing: f32[3] as tensor 'enc.0.bias' in `like`, "
        "absent in the file\n"
        "  'enc.0.b': unexpected: f32[3] in the file, absent in `like`\n"
        "  ['enc'][0]['w']: shape (3, 2) in `like`, (2, 3) in the file\n"
        "hint: `['enc'][0]['bias']` is read from 'enc.0.bias': did you mean 'enc.0.b'? "
        "(map a whole subtree with rename={\"['in_file']\": \"['in_like']\"})"
    )


def test_key_mismatch_message() -> None:
    key = jax.random.key(0)
    assert _message(tg.check, {"k": jax.random.key_data(key)}, {"k": key}) == (
        "2 mismatches between the tree and the spec:\n"
        "  ['k']: shape () in the spec, (2,) in the tree\n"
        "  ['k']: dtype key<fry> in the spec, uint32 in the tree\n"
        "hint: typed PRNG keys (key<fry>...) and raw key data (uint32, one more axis) "
        "differ: wrap raw data with jax.random.wrap_key_data(data, impl=...), or unwrap "
        "typed keys with jax.random.key_data(key), where the tree is built"
    )


def test_unknown_key_impl_message() -> None:
    assert _message(tg.LeafSpec, (), "key<evil>") == (
        "unknown PRNG key implementation 'key<evil>'; treeguard knows key<fry> "
        "(threefry2x32), key<rbg> (rbg), key<urbg> (unsafe_rbg)\n"
        "hint: save keys of a custom implementation as raw data (jax.random.key_data)"
    )
