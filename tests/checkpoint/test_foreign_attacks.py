"""Foreign weights as an adversary writes them: lying headers, hostile archives,
names that restyle a terminal, and an import that would overwrite its own source."""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from click.testing import CliRunner
from machine import traced_peak
from zips import central, eocd, local, zip64

import treeguard as tg
from treeguard._cli.main import main

#: The most tensors a foreign file may hold, as docs/explanation/guarantees.md
#: gives it ("more than a million tensors" are refused), and the refusal naming it.
LIMIT = 1_000_000
TOO_MANY = f"holds more than {LIMIT:,} tensors"
#: For a test that measures a peak of resident memory (``_peak_growth``).
CLEAR_REFS = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's clear_refs"
)


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _st(path: Path, header: dict[str, Any], data: bytes = b"") -> Path:
    """A safetensors file with exactly this header, as a hostile writer makes it."""
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


def _npy(arr: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


# -- headers that lie ---------------------------------------------------------------------


@CLEAR_REFS
@pytest.mark.parametrize(
    ("dtype", "shape"), [("F32", [0, 2**62]), ("F64", [0, 2**40, 2**40]), ("U8", [2**40, 0, 2**40])]
)
def test_zero_size_tensor_with_huge_axes_is_a_format_error(
    tmp_path: Path, dtype: str, shape: list[int]
) -> None:
    """No bytes at all, but axes numpy cannot hold: a FormatError naming the tensor."""
    f = _st(
        tmp_path / "z.safetensors", {"w": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}}
    )

    def read() -> None:
        with pytest.raises(tg.FormatError, match=r"tensor 'w': shape .* larger than any array"):
            tg.read_foreign(f)
        with pytest.raises(tg.FormatError, match="larger than any array"):
            tg.load(f, unverified="allow")
        with pytest.raises(tg.FormatError, match="larger than any array"):
            tg.import_weights(f, tmp_path / "out.safetensors")

    grown, error = _peak_growth(read)
    assert error is None and grown < 64 << 20, (grown, error)
    assert not (tmp_path / "out.safetensors").exists()
    res = _run("ckpt", "verify", str(f))
    assert res.exit_code == 2 and "larger than any array" in res.output, res.output


def test_zero_size_tensor_numpy_can_hold_still_loads(tmp_path: Path) -> None:
    f = _st(
        tmp_path / "z.safetensors",
        {"w": {"dtype": "F32", "shape": [0, 2**40], "data_offsets": [0, 0]}},
    )
    assert tg.read_foreign(f)["w"].shape == (0, 2**40)


# -- names and paths that are markup or control characters ------------------------------


def test_inspect_and_verify_print_hostile_names_and_paths_literally(tmp_path: Path) -> None:
    name = "[/bold]\x1b]0;owned\x07layer\nfake.row"
    (tmp_path / "[").mkdir()
    f = _st(
        tmp_path / "[" / "x].safetensors",
        {name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        bytes(4),
    )
    res = _run("ckpt", "inspect", str(f))
    assert res.exit_code == 0, (res.output, res.exception)
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert "[/bold]" in res.output and "\\x1b]0;owned\\x07layer\\nfake.row" in res.output
    assert f"{tmp_path}/[/x].safetensors" in res.output  # a path with a closing tag in it
    res = _run("ckpt", "verify", str(f))
    assert res.exit_code == 3, (res.output, res.exception)
    assert f"structure only: {tmp_path}/[/x].safetensors" in res.output
    dst = tmp_path / "[" / "o].safetensors"
    res = _run("import", str(f), str(dst), "--names", "flat")
    assert res.exit_code == 0, (res.output, res.exception)
    assert f"-> {dst}: 1 tensors" in res.output
    res = _run("ckpt", "inspect", str(dst))
    assert res.exit_code == 0 and "\x1b" not in res.output, (res.output, res.exception)
    assert f"{dst}" in res.output
    res = _run("ckpt", "verify", str(dst))
    assert res.exit_code == 0 and f"ok: {dst}: 1 tensors" in res.output, (res.output, res.exception)


# -- npz archives -------------------------------------------------------------------------


def test_npz_member_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.npz"
    with zipfile.ZipFile(path, "w") as z, pytest.warns(UserWarning, match="Duplicate name"):
        z.writestr("w.npy", _npy(np.zeros(3, np.float32)))
        z.writestr("w.npy", _npy(np.ones(3, np.float32)))
    with pytest.raises(tg.FormatError, match="member 'w.npy' appears twice"):
        tg.read_foreign(path)
    res = _run("import", str(path), str(tmp_path / "o.safetensors"))
    assert res.exit_code == 2 and "appears twice" in res.output, res.output
    assert not (tmp_path / "o.safetensors").exists()


def test_npz_encrypted_member_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "enc.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("w.npy", _npy(np.zeros(3, np.float32)))
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"PK\x03\x04") + 6] |= 1  # the "encrypted" flag, local and central
    raw[raw.index(b"PK\x01\x02") + 8] |= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(tg.FormatError, match="member 'w.npy' is encrypted"):
        tg.read_foreign(path)


def test_npz_negative_shape_is_named(tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": (-2, -2)}
    )
    path = tmp_path / "neg.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("w.npy", buf.getvalue() + bytes(16))  # (-2)*(-2)*4 bytes: the sizes agree
    with pytest.raises(tg.FormatError, match=r"member 'w.npy': shape \[-2, -2\] has a negative"):
        tg.read_foreign(path)


# -- orbax directories ------------------------------------------------------------------


def test_orbax_directory_with_a_link_or_fifo_is_refused_before_reading(tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ck", {"w": np.ones((2, 3), np.float32)})
    data = next(p for p in (tmp_path / "ck").rglob("*") if p.is_file() and p.parent.name == "d")
    outside = tmp_path / "elsewhere"
    shutil.move(data, outside)
    data.symlink_to(outside)  # tensorstore would follow it
    with pytest.raises(tg.FormatError, match=r"is not a regular file but a symbolic link"):
        tg.read_foreign(tmp_path / "ck")
    data.unlink()
    os.mkfifo(data)  # tensorstore would block on it forever
    res = _run("import", str(tmp_path / "ck"), str(tmp_path / "o.safetensors"))
    assert res.exit_code == 2 and "but a FIFO" in res.output, res.output
    assert not (tmp_path / "o.safetensors").exists()


# -- where the checkpoint is written ------------------------------------------------------


def test_import_refuses_to_overwrite_its_source(tmp_path: Path) -> None:
    src = tmp_path / "w.npz"
    np.savez(src, w=np.ones(2, np.float32))
    before = src.read_bytes()
    with pytest.raises(tg.FormatError, match="is the source itself"):
        tg.import_weights(src, src)
    os.link(src, tmp_path / "alias")  # another name of the same file
    res = _run("import", str(src), str(tmp_path / "alias"))
    assert res.exit_code == 2 and "the source itself" in res.output, res.output
    assert src.read_bytes() == before
    ck = tmp_path / "ck"
    ck.mkdir()
    with pytest.raises(tg.FormatError, match="inside the source directory"):
        tg.import_weights(ck, ck / "sub" / "o.safetensors")
    assert list(ck.iterdir()) == []


# -- a file that changes while it is read -----------------------------------------------


def test_file_truncated_between_header_and_data_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file loses its last bytes just as the first read past its header
    starts, after the header was read and checked against the file's size."""
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    data_start = 8 + len(json.dumps(header).encode())
    real = os.preadv
    cut: list[int] = []

    def shrinking(fd: int, buffers: Any, offset: int, *rest: Any) -> int:
        if offset >= data_start and not cut:
            os.truncate(f, data_start + 8)
            cut.append(offset)
        return real(fd, buffers, offset, *rest)

    monkeypatch.setattr(os, "preadv", shrinking)
    for read in (tg.read_foreign, lambda p: tg.load(p, unverified="allow")):
        cut.clear()
        f = _st(tmp_path / "t.safetensors", header, bytes(16))
        with pytest.raises(tg.FormatError, match="tensor 'a': the file was truncated while"):
            read(f)
        assert cut == [data_start]  # it shrank at the data read, not before


def test_source_written_to_during_import_is_refused(tmp_path: Path) -> None:
    """A writer appends to the file while it is imported: the sha256 recorded
    would not be of the weights read, so nothing is written."""
    from flax import serialization

    src = tmp_path / "w.msgpack"
    src.write_bytes(serialization.msgpack_serialize({"w": np.ones(3, np.float32)}))

    def name_and_write(keys: tuple[Any, ...]) -> str:
        with src.open("ab") as f:  # another process writing to the file meanwhile
            f.write(b"\0")
        return ".".join(map(str, keys))

    like = {"w": np.zeros(3, np.float32)}
    with pytest.raises(tg.FormatError, match="the file changed while it was imported"):
        tg.import_weights(src, tmp_path / "o.safetensors", names=name_and_write, like=like)
    assert not (tmp_path / "o.safetensors").exists()
    src.write_bytes(serialization.msgpack_serialize({"w": np.ones(3, np.float32)}))
    h = tg.import_weights(src, tmp_path / "o.safetensors", like=like)
    assert h.metadata["imported_from"]["blake3"] == blake3.blake3(src.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (b"[" * 100_000, "_METADATA: it nests deeper than"),
        (b'{"tree_metadata": {}, "tree_metadata": {}}', "'tree_metadata' appears twice"),
        (b"\xff\xfe{}", "_METADATA: not UTF-8 text"),
        (b'{"use_ocdbt": NaN}', "_METADATA: .*NaN"),
    ],
    ids=["deep", "duplicate-key", "not-utf8", "nan"],
)
def test_orbax_hostile_metadata_json(tmp_path: Path, metadata: bytes, message: str) -> None:
    """orbax parses ``_METADATA`` with ``json.loads`` (a RecursionError when deep,
    the last of two keys): it is read strictly first."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "_METADATA").write_bytes(metadata)
    with pytest.raises(tg.FormatError, match=message):
        tg.read_foreign(ck)
    (ck / "_METADATA").unlink()
    with pytest.raises(tg.FormatError, match="no tree metadata"):
        tg.read_foreign(ck)


def test_the_tensor_limit_tested_is_the_documented_one() -> None:
    guarantees = Path(__file__).parents[2] / "docs" / "explanation" / "guarantees.md"
    assert "more than a million tensors" in guarantees.read_text()


def _peak_growth(read: Callable[[], Any]) -> tuple[int, BaseException | None]:
    """How far this process's peak resident memory rose over what it held
    while ``read`` ran (Linux resets the peak through ``clear_refs``), and
    what ``read`` raised."""
    status = Path("/proc/self/status")

    def kib(field: str) -> int:
        line = next(x for x in status.read_text().splitlines() if x.startswith(field + ":"))
        return int(line.split()[1])

    Path("/proc/self/clear_refs").write_text("5")  # the peak is what is resident now
    before = kib("VmRSS")
    error: BaseException | None = None
    try:
        read()
    except Exception as e:  # returned for the test to judge
        error = e
    return (kib("VmHWM") - before) * 1024, error


def _raised(read: Callable[[], Any]) -> BaseException | None:
    """What ``read`` raised, or None."""
    try:
        read()
    except Exception as e:  # returned for the test to judge
        return e
    return None


def _wide_safetensors(path: Path, count: int) -> Path:
    """A header of ``count`` zero-size tensors, written as text; the names are
    as long as a model's (a header of names a few characters long is refused
    sooner, by its memory budget)."""
    entry = '"model.layers.{:07d}.mlp.weight":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
    raw = ("{" + ",".join(map(entry.format, range(count))) + "}").encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    return path


@pytest.mark.slow
@CLEAR_REFS
@pytest.mark.parametrize("entry", ["load", "cli-inspect"])
def test_a_safetensors_file_of_too_many_tensors_is_refused_before_its_arrays(
    tmp_path: Path, entry: str
) -> None:
    """A million and one zero-size tensors in 78 MiB of header, each a record
    and an array once read: refused by count before a record or array is made
    of any tensor (10 times the file with no count check; 3.5 times with the
    count taken after the table is read; the next test bounds the objects the
    count itself holds)."""
    f = _wide_safetensors(tmp_path / "wide.safetensors", LIMIT + 1)
    if entry == "cli-inspect":
        res = _run("ckpt", "inspect", str(f))
        assert res.exit_code == 2 and TOO_MANY in res.output, res.output
        return
    grown, error = _peak_growth(lambda: tg.load(f, unverified="allow"))
    assert grown < 6 * f.stat().st_size, f"{grown:,} bytes over {f.stat().st_size:,} of file"
    assert isinstance(error, tg.FormatError) and TOO_MANY in str(error), error


@pytest.mark.slow
def test_a_safetensors_header_of_too_many_entries_is_counted_before_any_is_built(
    tmp_path: Path,
) -> None:
    """The million and one entries are counted from the header's bytes: the
    count holds a few KiB of objects at its peak, where reading the table
    first held 182 MiB of them (2.3 times the file) before it counted."""
    one = _wide_safetensors(tmp_path / "one.safetensors", 1)
    tg.load(one, names="dotted", unverified="allow")  # the imports a load makes, made
    f = _wide_safetensors(tmp_path / "wide.safetensors", LIMIT + 1)
    error, peak = traced_peak(lambda: _raised(lambda: tg.load(f, unverified="allow")))
    assert isinstance(error, tg.FormatError) and TOO_MANY in str(error), error
    assert peak < f.stat().st_size // 64, f"{peak:,} bytes of objects"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("leaves", "refusal"),
    [(LIMIT + 1, TOO_MANY), (LIMIT, r"\[\d+\]: a NoneType, not an array")],
    ids=["one-too-many", "exactly-the-limit"],
)
def test_a_msgpack_file_of_too_many_leaves_is_refused_before_any_array(
    tmp_path: Path, leaves: int, refusal: str
) -> None:
    """Each leaf of two bytes of msgpack would be an array of ~100 bytes. These
    are nils, which no array is made of: had a leaf been made one before the
    count, the refusal would name that leaf. At the limit the count passes and
    the first leaf is refused."""
    import msgpack

    f = tmp_path / "wide.msgpack"
    f.write_bytes(msgpack.packb([None] * leaves))
    with pytest.raises(tg.FormatError, match=refusal):
        tg.read_foreign(f, names="flat")


@pytest.mark.slow
def test_an_npz_archive_of_too_many_members_is_refused_before_any_is_read(tmp_path: Path) -> None:
    """A million and one stored members of no bytes, none an .npy array: had
    one been read before the count, the refusal would name it."""
    members = [(f"w{i}.npy".encode(), b"") for i in range(LIMIT + 1)]
    path = tmp_path / "wide.npz"
    path.write_bytes(zip64(members))
    with pytest.raises(tg.FormatError, match=TOO_MANY):
        tg.read_foreign(path)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_import_refuses_a_destination_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    src = tmp_path / "w.npz"
    np.savez(src, w=np.ones(2, np.float32))
    victim = tmp_path / "victim"
    victim.write_text("kept")
    dst = tmp_path / "dst"
    if kind == "symlink":
        dst.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(dst)
    else:
        dst.mkdir()
    res = _run("import", str(src), str(dst))
    assert res.exit_code == 2 and "not a regular file" in res.output, res.output
    assert victim.read_text() == "kept"
    assert dst.is_symlink() if kind == "symlink" else not dst.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "victim", "w.npz"]


def test_bool_bytes_other_than_0_or_1_are_refused(tmp_path: Path) -> None:
    """numpy keeps such a byte (``~a`` and ``a == True`` then disagree with the
    printed value), and two files meaning the same values would hash apart."""
    table = {"m": {"dtype": "BOOL", "shape": [2, 2], "data_offsets": [0, 4]}}
    f = _st(tmp_path / "b.safetensors", table, bytes([0, 1, 1, 2]))
    with pytest.raises(tg.FormatError, match="tensor 'm': element 3 is a byte other than 0 or 1"):
        tg.load(f, like={"m": np.zeros((2, 2), bool)}, names="flat", unverified="allow")
    res = _run("import", str(f), str(tmp_path / "o.safetensors"))
    assert res.exit_code == 2 and "element 3 is a byte other than 0 or 1" in res.output
    assert not (tmp_path / "o.safetensors").exists()
    raw = _npy(np.array([True, False]))[:-1] + b"\x07"  # the last element's byte
    with zipfile.ZipFile(tmp_path / "b.npz", "w") as z:
        z.writestr("m.npy", raw)
    with pytest.raises(tg.FormatError, match="member 'm.npy': element 1 is a byte other"):
        tg.read_foreign(tmp_path / "b.npz")
    f.write_bytes(f.read_bytes()[:-1] + b"\x01")
    assert tg.read_foreign(f)["m"].tolist() == [[False, True], [True, True]]


def test_recorded_digest_beats_the_unverified_refusal(tmp_path: Path) -> None:
    """A foreign file put where a pinned checkpoint was is an IntegrityError,
    not a refusal whose hint says to pass unverified="allow"."""
    f = _st(
        tmp_path / "w.safetensors",
        {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        bytes(4),
    )
    for unverified in ("refuse", "warn", "allow"):
        with pytest.raises(tg.IntegrityError, match="carries no treeguard digest") as e:
            tg.load(f, names="flat", unverified=unverified, expect_digest="ab" * 32)  # type: ignore[arg-type]
        assert "unverified" not in str(e.value)


def test_npz_members_that_overlap_are_refused(tmp_path: Path) -> None:
    """Member a's bytes hold member b whole (the overlap a zip bomb repeats for
    every member); each reads as a valid array on its own."""
    b_data = _npy(np.zeros(256, np.float32))
    b_entry = local(b"b.npy", b_data)
    a_head = _npy(np.zeros(len(b_entry), np.uint8))[: -len(b_entry)]
    a_data = a_head + b_entry
    archive = local(b"a.npy", a_data)
    b_offset = 30 + len(b"a.npy") + len(a_head)
    directory = central(b"a.npy", a_data, 0) + central(b"b.npy", b_data, b_offset)
    path = tmp_path / "overlap.npz"
    path.write_bytes(archive + directory + eocd(2, len(directory), len(archive)))
    with zipfile.ZipFile(path) as z:  # zipfile itself reads both
        assert len(z.read("a.npy")) == len(a_data) and z.read("b.npy") == b_data
    with pytest.raises(tg.FormatError, match="member 'a.npy' overlaps the next one"):
        tg.read_foreign(path)


@CLEAR_REFS
def test_orbax_array_claiming_far_more_than_its_files_is_refused(tmp_path: Path) -> None:
    """A zarr shape edited to 2 GiB over 2x3 stored values: the restore
    allocates the claimed array before it finds the chunks missing (claimed
    beyond memory, the process aborts in std::bad_alloc)."""
    import orbax.checkpoint as ocp

    ck = tmp_path / "ck"
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)) as ckptr:
        ckptr.save(ck, {"w": np.ones((2, 3), np.float32)})
    zarray = ck / "w" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["shape"] = [2**15, 2**14]  # one chunk of 2x3 stored, the rest "missing"
    zarray.write_text(json.dumps(meta))
    grown, error = _peak_growth(lambda: tg.read_foreign(ck))
    assert isinstance(error, tg.FormatError), error
    assert "arrays claim 2,147,483,648 bytes, its files hold" in str(error), error
    assert grown < 256 << 20, grown


@pytest.mark.parametrize("ocdbt", [False, True], ids=["zarr-files", "ocdbt"])
def test_orbax_chunk_reaching_beyond_its_array_is_refused(tmp_path: Path, ocdbt: bool) -> None:
    """A chunk is decoded (or filled) whole to read any part of it: a 2x3
    array whose one chunk claims 2**26 rows would cost 768 MiB to read."""
    import orbax.checkpoint as ocp
    import tensorstore as ts

    ck = tmp_path / "ck"
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt)) as ckptr:
        ckptr.save(ck, {"w": np.ones((2, 3), np.float32)})
    if ocdbt:
        kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{ck}/"}).result()
        key = next(k for k in kv.list().result() if k.endswith(b"/.zarray"))
        meta = json.loads(kv.read(key).result().value)
        meta["chunks"] = [2**26, 3]
        kv.write(key, json.dumps(meta).encode()).result()
    else:
        zarray = ck / "w" / ".zarray"
        meta = json.loads(zarray.read_text())
        meta["chunks"] = [2**26, 3]
        zarray.write_text(json.dumps(meta))
    with pytest.raises(tg.FormatError) as info:
        tg.read_foreign(ck)
    assert str(info.value) == (
        f"{ck}: array 'w': a chunk of shape [67108864, 3] in an array of shape [2, 3]: a chunk "
        "is decoded whole, so it may not reach beyond its array\n"
        "hint: get a fresh copy of the checkpoint"
    )


def test_import_into_a_missing_directory_names_it_before_reading(tmp_path: Path) -> None:
    src = tmp_path / "w.npz"
    np.savez(src, w=np.ones(2, np.float32))
    res = _run("import", str(src), str(tmp_path / "nodir" / "o.safetensors"))
    assert res.exit_code == 2, res.output
    assert "the destination's directory does not exist" in res.output
    assert f"{tmp_path}/nodir'" in res.output and ".tmp" not in res.output
    assert not res.output.startswith(f"error: {src}")
