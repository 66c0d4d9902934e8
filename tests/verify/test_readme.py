"""The README's Python examples for updates and verify run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    (found,) = [b for b in blocks if marker in b]
    return found


def _run(code: str, capsys: pytest.CaptureFixture[str]) -> str:
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    return capsys.readouterr().out


def test_the_updates_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(_block("tg.updater(lambda p, g"), capsys)
    assert "['dense1']['b']: shape (3,) in the params, (2, 3) in the updates" in out
    assert "['dense1']['w']: dtype bfloat16 in the params, float32 in the updates" in out


def test_the_verify_model_example_builds() -> None:
    exec(compile(_block("params_spec="), str(README), "exec"), {})


def test_the_typed_key_example_restores_the_rng_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the example writes net.safetensors where it runs
    _run(_block("class Net(nnx.Module)"), capsys)
    assert (tmp_path / "net.safetensors").is_file()


@pytest.mark.slow
def test_the_nnx_example_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(_block("class MLP(nnx.Module)"), capsys)
    assert "params and optimizer state keep their specs" in out


@pytest.mark.slow
def test_the_equinox_example_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    _run(_block("import equinox as eqx"), capsys)
