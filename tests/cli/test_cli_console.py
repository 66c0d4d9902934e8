"""What the commands print from a file has its control characters spelled out."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import treeguard as tg
from treeguard import LeafSpec
from treeguard._cli.main import main


def test_spec_spells_out_escapes_in_a_file_s_names_and_symbols(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    tg.spec_of({"a": {"w\x1b[2J": LeafSpec(("B\x1b]0;x\x07", 2), "float32")}}).save(path)
    res = CliRunner().invoke(main, ["spec", str(path)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert r"['w\x1b[2J'] f32[B\x1b]0;x\x07,2]  symbolic params  -" in res.output
