"""An ``.npz`` archive of too many members is refused by the count its end
records claim, before ``zipfile`` reads its central directory (an object per
entry); one that claims few and holds many is still refused, by what
``zipfile`` read. The refusal is the one every reader gives
(docs/explanation/guarantees.md: "more than a million tensors")."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from machine import traced_peak
from zips import eocd, zip64

import treeguard as tg
from treeguard._cli.main import main

LIMIT = 1_000_000
#: The refusal of an archive of too many members, in full, after the file's name.
TOO_MANY = (
    f"holds more than {LIMIT:,} tensors; no model has that many\n"
    "hint: a file this wide is a decompression bomb or corrupt; get a fresh copy"
)
_W = np.arange(3, dtype=np.float32)


def _npy(arr: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _refusal(path: Path) -> str:
    with pytest.raises(tg.FormatError) as e:
        tg.read_foreign(path)
    return str(e.value)


@pytest.mark.parametrize("comment", [b"", b"c" * 0xFFFF], ids=["no-comment", "64k-comment"])
def test_an_npz_claiming_too_many_members_is_refused_before_its_directory(
    tmp_path: Path, comment: bytes
) -> None:
    """Its ZIP64 end record claims a million and one entries; its directory
    holds one member, which zipfile reads (it goes by the directory's size)."""
    path = tmp_path / "claims.npz"
    path.write_bytes(zip64([(b"w.npy", _npy(_W))], claimed=LIMIT + 1, comment=comment))
    with zipfile.ZipFile(path) as z:
        assert z.namelist() == ["w.npy"]
    assert _refusal(path) == f"{path}: {TOO_MANY}"
    res = CliRunner().invoke(main, ["import", str(path), str(tmp_path / "out.safetensors")])
    assert res.exit_code == 2 and "holds more than 1,000,000 tensors" in res.output, res.output
    assert not (tmp_path / "out.safetensors").exists()


def test_an_npz_claiming_too_many_where_the_locator_points_is_refused(tmp_path: Path) -> None:
    """Another ZIP64 end record, where the locator points (the start of the
    file), claims a million and one; zipfile reads the one before the locator
    and the archive's one member behind the prefix."""
    archive = zip64([(b"w.npy", _npy(_W))])
    forged = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, LIMIT + 1, LIMIT + 1, 0, 0)
    at = len(archive) - 22 - 20  # the locator, before the 22-byte EOCD
    locator = struct.pack("<IIQI", 0x07064B50, 0, 0, 1)
    path = tmp_path / "points.npz"
    path.write_bytes(forged + archive[:at] + locator + archive[at + 20 :])
    with zipfile.ZipFile(path) as z:
        assert z.read("w.npy") == _npy(_W)
    assert _refusal(path) == f"{path}: {TOO_MANY}"


@pytest.mark.parametrize(
    ("claimed", "comment"),
    [(None, b""), (None, b"c" * 0xFFFF), (LIMIT, b"")],
    ids=["zip64", "zip64-64k-comment", "claims-the-limit"],
)
def test_an_npz_in_zip64_form_reads(tmp_path: Path, claimed: int | None, comment: bytes) -> None:
    """A ZIP64 archive is read as any other, a comment after its end record
    too; a claim of exactly the limit is no refusal (zipfile reads two)."""
    members = [(b"w.npy", _npy(_W)), (b"b.npy", _npy(_W[:1]))]
    path = tmp_path / "ok.npz"
    path.write_bytes(zip64(members, claimed=claimed, comment=comment))
    got = tg.read_foreign(path)
    assert sorted(got) == ["b", "w"]
    np.testing.assert_array_equal(got["w"], _W)


@pytest.mark.parametrize(
    "raw",
    [
        b"PK\x05\x06" + bytes(10),
        struct.pack("<IIQI", 0x07064B50, 0, 2**63, 1) + eocd(0xFFFF, 0, 0),
    ],
    ids=["eocd-cut-short", "locator-past-the-end"],
)
def test_end_records_cut_short_or_pointing_nowhere_are_a_format_error(
    tmp_path: Path, raw: bytes
) -> None:
    """Records the count cannot read claim nothing: zipfile then says what is wrong."""
    path = tmp_path / "bad.npz"
    path.write_bytes(raw)
    assert "not a readable .npz archive" in _refusal(path)


def test_a_locator_naming_no_record_claims_nothing(tmp_path: Path) -> None:
    """A ZIP64 locator whose offset and the bytes before it hold no ZIP64
    record: the EOCD's count stands, and zipfile reads its empty directory."""
    path = tmp_path / "empty.npz"
    path.write_bytes(
        b"PK\x03\x04" + bytes(60) + struct.pack("<IIQI", 0x07064B50, 0, 0, 1) + eocd(1, 0, 0)
    )
    assert tg.read_foreign(path) == {}


@pytest.mark.slow
def test_an_npz_claiming_few_but_holding_too_many_is_refused_before_its_directory(
    tmp_path: Path,
) -> None:
    """Its end records claim one entry; its directory holds a million and one
    members of no bytes, none an .npy array: refused by the directory's size
    at the cost of its end records (zipfile's read of it held 477 MiB)."""
    members = [(f"w{i}.npy".encode(), b"") for i in range(LIMIT + 1)]
    path = tmp_path / "hides.npz"
    path.write_bytes(zip64(members, claimed=1))

    def refused() -> str:
        return _refusal(path)

    message, peak = traced_peak(refused)
    assert message == f"{path}: {TOO_MANY}"
    assert peak < 1 << 20, f"{peak:,} bytes of objects"


@pytest.mark.parametrize("extra", [0, 1])
def test_an_npz_whose_directory_could_hold_too_many_is_refused_unread(
    tmp_path: Path, extra: int
) -> None:
    """An EOCD that claims one entry and a directory of room for the limit's
    entries of 46 bytes (or one more): the directory is not read (it holds a
    local header and zeros, which zipfile calls a bad magic number), refused
    by its size alone."""
    directory = 46 * (LIMIT + extra)
    path = tmp_path / "room.npz"
    with path.open("wb") as f:
        f.write(b"PK\x03\x04")  # a zip archive's first bytes
        f.truncate(directory)  # sparse: no 46 MB written
        f.seek(directory)
        f.write(eocd(1, directory, 0))
    if extra:
        assert _refusal(path) == f"{path}: {TOO_MANY}"
    else:
        assert "not a readable .npz archive" in _refusal(path)


@pytest.mark.slow
def test_an_npz_of_too_many_members_is_refused_at_the_cost_of_its_end_records(
    tmp_path: Path,
) -> None:
    """A million and one members refused by the count claimed: a few KiB of
    objects at the peak, where zipfile's directory read first held 477 MiB."""
    small = tmp_path / "one.npz"
    np.savez(small, w=_W)
    tg.read_foreign(small)  # the imports a read makes, made
    members = [(f"w{i}.npy".encode(), b"") for i in range(LIMIT + 1)]
    path = tmp_path / "wide.npz"
    path.write_bytes(zip64(members))

    def refused() -> str:
        return _refusal(path)

    message, peak = traced_peak(refused)
    assert message == f"{path}: {TOO_MANY}"
    assert peak < 1 << 20, f"{peak:,} bytes of objects"
