"""The shared file primitives and the strict JSON reader, attacked directly:
modes, links, FIFOs, sizes, and JSON that is hostile as JSON."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

import treeguard as tg
from treeguard import FormatError

# The shared primitives themselves, on purpose: every reader and writer of a file
# goes through them, and here they meet links, FIFOs and hostile JSON directly.
from treeguard._src import strictjson
from treeguard._src.atomic import atomic_write, open_regular, read_regular, remove_stale_temps


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_specs_and_checkpoints_get_the_same_mode(tmp_path: Path) -> None:
    tree = {"w": jnp.ones(2)}
    tg.spec_of(tree).save(tmp_path / "a.spec.json")
    tg.save(tmp_path / "a.safetensors", tree)
    mask = os.umask(0o022)
    os.umask(mask)
    assert _mode(tmp_path / "a.spec.json") == _mode(tmp_path / "a.safetensors") == 0o666 & ~mask


def test_atomic_write_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / "target").symlink_to(victim)
    atomic_write(tmp_path / "target", b"new")
    assert victim.read_text() == "untouched"
    assert not (tmp_path / "target").is_symlink() and (tmp_path / "target").read_bytes() == b"new"


def test_stale_temps_of_dead_writers_are_reclaimed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / f".x.json.{2**22 + 99}.0123abcd.tmp"
    live = tmp_path / f".x.json.{os.getpid()}.0123abcd.tmp"
    dead.write_bytes(b"half")
    live.write_bytes(b"half")
    (tmp_path / f".dir.{2**22 + 98}.0123abcd.tmp").mkdir()  # not a file: never removed
    assert remove_stale_temps(str(tmp_path)) == [dead.name]
    assert live.exists() and (tmp_path / f".dir.{2**22 + 98}.0123abcd.tmp").is_dir()


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink", "missing"])
def test_open_regular_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
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
            open_regular(p)
        return
    names = {"fifo": "a FIFO", "dir": "a directory", "symlink": "a symbolic link"}
    with pytest.raises(FormatError, match=f"the file is not a regular file but {names[kind]}"):
        open_regular(p)


def test_read_regular_is_bounded(tmp_path: Path) -> None:
    p = tmp_path / "big"
    p.write_bytes(b"x" * 101)
    with pytest.raises(FormatError, match="the pointer is 101 bytes, more than the 100 allowed"):
        read_regular(p, limit=100, what="pointer")
    assert read_regular(p, limit=101) == b"x" * 101


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
def test_strict_json_refuses_hostile_documents(text: str, why: str) -> None:
    with pytest.raises(FormatError, match=why) as info:
        strictjson.loads(text, "the status file", context="s.json", hint="write it again")
    assert str(info.value).startswith("s.json: the status file")
    assert str(info.value).endswith("\nhint: write it again")


def test_strict_json_refuses_invalid_utf8() -> None:
    with pytest.raises(FormatError, match="not valid JSON: 'utf-8' codec"):
        strictjson.loads(b'{"a": "\xff"}', "the pointer")


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
    assert strictjson.loads(strictjson.dumps(value), "the doc") == value


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


def test_atomic_write_leaves_no_temp_file_on_failure(tmp_path: Path) -> None:
    def fail(fd: int) -> None:
        os.write(fd, b"half")
        raise OSError(28, "No space left on device")

    target = tmp_path / "x.json"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="No space"):
        atomic_write(target, fail)
    assert os.listdir(tmp_path) == ["x.json"] and target.read_bytes() == b"old"
