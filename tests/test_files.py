"""The shared file primitives through the readers and writers that use them:
modes, links, FIFOs, sizes, and JSON that is hostile as JSON."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import treeguard as tg
from treeguard import FormatError


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_specs_and_checkpoints_get_the_same_mode(tmp_path: Path) -> None:
    tree = {"w": jnp.ones(2)}
    tg.spec_of(tree).save(tmp_path / "a.spec.json")
    tg.save(tmp_path / "a.safetensors", tree)
    mask = os.umask(0o022)
    os.umask(mask)
    assert _mode(tmp_path / "a.spec.json") == _mode(tmp_path / "a.safetensors") == 0o666 & ~mask


def test_a_write_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    tree = {"w": jnp.ones(2)}
    for name, write in (("ckpt", lambda p: tg.save(p, tree)), ("spec", tg.spec_of(tree).save)):
        victim = tmp_path / f"{name}-victim"
        victim.write_text("untouched")
        target = tmp_path / name
        target.symlink_to(victim)
        write(target)
        assert victim.read_text() == "untouched"
        assert not target.is_symlink() and target.is_file()
    assert tg.read_header(tmp_path / "ckpt").spec == tg.spec_of(tree)
    assert tg.TreeSpec.load(tmp_path / "spec") == tg.spec_of(tree)


def test_stale_temps_of_dead_writers_are_reclaimed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / f".x.safetensors.{2**22 + 99}.0123abcd.tmp"
    live = tmp_path / f".x.safetensors.{os.getpid()}.0123abcd.tmp"
    other = tmp_path / f".y.safetensors.{2**22 + 99}.0123abcd.tmp"  # another file's
    for p in (dead, live, other):
        p.write_bytes(b"half")
    folder = tmp_path / f".x.safetensors.{2**22 + 98}.0123abcd.tmp"
    folder.mkdir()  # not a file: never removed
    tg.save(tmp_path / "x.safetensors", {"w": jnp.ones(2)})  # reclaims its own target's temps
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["x.safetensors", live.name, other.name, folder.name]
    )


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink", "missing"])
def test_a_reader_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "symlink":
        (tmp_path / "real").write_text("x")
        p.symlink_to(tmp_path / "real")
    if kind == "missing":
        with pytest.raises(FileNotFoundError):
            tg.read_header(p)
        return
    names = {"fifo": "a FIFO", "dir": "a directory", "symlink": "a symbolic link"}
    with pytest.raises(
        FormatError, match=f"{p}: the checkpoint is not a regular file but {names[kind]}"
    ):
        tg.read_header(p)


def test_a_read_is_bounded(tmp_path: Path) -> None:
    limit = 4 * 1024 * 1024  # a flight-recorder bundle's manifest
    manifest = tmp_path / "BUNDLE.json"
    with manifest.open("wb") as f:
        f.truncate(limit + 1)  # sparse: nothing is written
    with pytest.raises(
        FormatError, match=f"the manifest is {limit + 1} bytes, more than the {limit} allowed"
    ):
        tg.read_bundle(tmp_path)
    os.truncate(manifest, limit)  # at the limit: read whole, then refused as JSON
    with pytest.raises(FormatError, match="the manifest is not valid JSON: Expecting value"):
        tg.read_bundle(tmp_path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"a": 1, "a": 2}', "the key 'a' appears twice in one object"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": -Infinity}', "-Infinity is not a JSON number"),
        ('{"a": 1e999}', "the number 1e999 is too large for a float"),
        ('{"a": ' + "1" * 5000 + "}", "an integer of 5000 digits is larger than any size"),
        ("[" * 600 + "]" * 600, "it nests deeper than 512 levels"),
        ('{"a": "\\ud800"}', "is not valid JSON: .*surrogates not allowed"),
        ('{"a": ', "is not valid JSON: Expecting value"),
    ],
)
def test_strict_json_refuses_hostile_documents(tmp_path: Path, text: str, why: str) -> None:
    spec = tmp_path / "spec.json"  # one of the JSON files every reader parses strictly
    spec.write_text(text, errors="surrogatepass")
    with pytest.raises(FormatError, match=why) as info:
        tg.TreeSpec.load(spec)
    assert str(info.value).startswith(f"{spec}: spec")


def test_strict_json_refuses_invalid_utf8(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(FormatError, match="not valid JSON: 'utf-8' codec"):
        tg.TreeSpec.load(spec)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_strict_json_round_trips_every_plain_document(value: object) -> None:
    # a checkpoint's header is written and read back as strict JSON
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.safetensors"
        tg.save(path, {"w": np.zeros(1, np.float32)}, metadata={"value": value})
        assert tg.read_header(path).metadata["value"] == value


def test_errors_render_from_their_fields_and_show_as_treeguard_names() -> None:
    e = tg.StoreError("version v1 is rejected", version="v1", context="/s", hint="verify it")
    assert str(e) == "/s: version v1 is rejected\nhint: verify it"
    assert (e.message, e.context, e.hint, e.version) == (
        "version v1 is rejected",
        "/s",
        "verify it",
        "v1",
    )
    for cls in (tg.StoreError, tg.IntegrityError, tg.FormatError, tg.SignatureError):
        assert cls.__module__ == "treeguard" and cls.__qualname__ in tg.__all__
    assert str(tg.UnknownVersionError("no version v9")) == "no version v9"  # not quoted
    assert tg.VerificationError.exit_code == 1 and tg.FormatError.exit_code == 2


def test_metadata_that_could_not_be_read_back_is_refused_by_save(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"metadata\['n'\]: an integer of 22 digits is too long"):
        tg.save(tmp_path / "a.safetensors", {"w": jnp.ones(2)}, metadata={"n": 2**70})
    assert not (tmp_path / "a.safetensors").exists()
    tg.save(tmp_path / "a.safetensors", {"w": jnp.ones(2)}, metadata={"n": 2**64})
    assert tg.read_header(tmp_path / "a.safetensors").metadata == {"n": 2**64}


def test_a_write_that_fails_half_way_leaves_no_temp_file(tmp_path: Path) -> None:
    gone = jnp.ones(1000)
    gone.delete()  # its bytes cannot be fetched: the write fails after the header and ['a']
    target = tmp_path / "x.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        tg.save(target, {"a": jnp.ones(3), "w": gone})
    assert os.listdir(tmp_path) == ["x.safetensors"] and target.read_bytes() == b"old"
