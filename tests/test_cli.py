"""The command line, in process through click's CliRunner: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import pytest
from click.testing import CliRunner, Result
from corpus import seed_params

import treeguard as tg
from treeguard.cli import main


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def specs(tmp_path: Path) -> tuple[Path, Path]:
    good = tmp_path / "good.json"
    tg.spec_of(seed_params()).save(good)
    changed = seed_params()
    changed["dense_2"] = changed.pop("dense2")
    changed["dense1"]["b"] = jnp.zeros((2, 3))
    bad = tmp_path / "bad.json"
    tg.spec_of(changed).save(bad)
    return good, bad


def test_spec_prints_the_tree(specs: tuple[Path, Path]) -> None:
    out = _run("spec", str(specs[0]))
    assert out.exit_code == 0, out.stderr
    assert "4 leaves  13 params  52 B" in out.stdout
    assert "['w'] f32[2,3]  6 params  24 B" in out.stdout
    assert "['dense1'] dict  2 leaves  9 params" in out.stdout


def test_spec_json_is_the_file(specs: tuple[Path, Path]) -> None:
    out = _run("spec", str(specs[0]), "--json")
    assert out.exit_code == 0
    assert out.stdout == specs[0].read_text()


def test_diff_match_exits_0(specs: tuple[Path, Path]) -> None:
    out = _run("diff", str(specs[0]), str(specs[0]))
    assert out.exit_code == 0
    assert "match" in out.stdout


def test_diff_mismatch_exits_1_and_lists_everything(specs: tuple[Path, Path]) -> None:
    good, bad = specs
    out = _run("diff", str(good), str(bad))
    assert out.exit_code == 1
    lines = out.stdout.splitlines()
    assert lines[0] == f"3 mismatches between {bad} and {good}:"
    assert f"  ['dense1']['b']: shape (3,) in {good}, (2, 3) in {bad}" in lines
    assert lines[-1] == f"hint: `['dense_2']` in {bad}: did you mean `['dense2']`?"


def test_diff_json(specs: tuple[Path, Path]) -> None:
    out = _run("diff", str(specs[0]), str(specs[1]), "--json")
    assert out.exit_code == 1
    payload = json.loads(out.stdout)
    assert payload["match"] is False
    assert payload["mismatches"][0] == {
        "path": "['dense1']['b']",
        "kind": "shape",
        "expected": [3],
        "actual": [2, 3],
    }


@pytest.mark.parametrize("content", ["{", '{"format": "treeguard.spec/7", "tree": {}}', "\x00\x01"])
def test_unreadable_input_exits_2(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text(content)
    out = _run("spec", str(bad))
    assert out.exit_code == 2
    assert out.stderr.startswith(f"error: {bad}: ")


def test_missing_file_and_usage_exit_2(tmp_path: Path) -> None:
    assert _run("spec", str(tmp_path / "nope.json")).exit_code == 2
    assert _run("diff", "only-one").exit_code == 2
    assert _run("no-such-command").exit_code == 2
