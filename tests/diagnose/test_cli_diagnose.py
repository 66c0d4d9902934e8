"""``treeguard diagnose``: exit codes, reports, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
from click.testing import CliRunner

from treeguard import save
from treeguard._cli.main import main


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["diagnose", *args])
    return result.exit_code, result.output


def test_the_example_passes_the_chosen_stages_and_writes_three_reports(tmp_path: Path) -> None:
    code, out = _run(
        "treeguard.examples.mlp:model", "--stages", "data,shapes", "--report-dir", str(tmp_path)
    )
    assert code == 0, out
    assert "exit status 0" in out
    doc = json.loads((tmp_path / "diagnosis.json").read_text())
    assert doc["format"] == "treeguard.diagnose/1"
    assert [(s["name"], s["status"]) for s in doc["stages"]] == [
        ("data", "pass"),
        ("shapes", "pass"),
    ]
    html = (tmp_path / "diagnosis.html").read_text()
    assert "<script" not in html and "Stage ladder" in html
    assert (
        (tmp_path / "diagnosis.md")
        .read_text()
        .startswith("# treeguard diagnose `treeguard.examples.mlp:model`")
    )


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    code, out = _run("treeguard.examples.mlp")
    assert code == 2 and "is not MODULE:ATTR" in out
    code, out = _run("treeguard.examples.mlp:model", "--stages", "warp")
    assert code == 2 and "unknown stage(s) ['warp']" in out
    code, out = _run("treeguard.examples.mlp:model", "--against", str(tmp_path / "nope"))
    assert code == 2 and "no trace file at" in out
    trace = tmp_path / "t.safetensors"
    code, out = _run(
        "treeguard.examples.mlp:model", "--record", str(trace), "--against", str(trace)
    )
    assert code == 2 and "--record and --against exclude each other" in out


def test_a_checkpoint_that_is_no_trace_exits_2(tmp_path: Path) -> None:
    save(tmp_path / "p.safetensors", {"w": jnp.ones(2)})
    code, out = _run("treeguard.examples.mlp:model", "--against", str(tmp_path / "p.safetensors"))
    assert code == 2 and "not a recorded trace" in out
