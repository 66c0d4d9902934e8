"""``treeguard verify MODULE:ATTR``: real subprocesses, real report files, exit codes 0/1/2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest
from click.testing import CliRunner
from refpaths import references_of
from subproc import run_python

from treeguard._cli.verify import verify
from treeguard.verify import CHECKS

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "treeguard", "verify", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_demo_passes_and_writes_reports(tmp_path: Path) -> None:
    proc = _cli("treeguard.examples.mlp:model", "--report-dir", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in CHECKS:
        assert f"│ {name}" in proc.stdout
    assert "all checks passed" in proc.stdout
    assert f"report: {tmp_path / 'out' / 'report.html'}" in proc.stdout
    for f in ("report.json", "report.md", "report.html"):
        assert (tmp_path / "out" / f).stat().st_size > 0


BROKEN = """
import dataclasses
import jax
from treeguard.examples import mlp

def _up(params, grads):
    return jax.tree.map(lambda p, g: p + 0.01 * g, params, grads)

model = dataclasses.replace(mlp.model, update=_up)
not_a_model = 3

def make():
    return mlp.model
"""


@pytest.fixture
def broken_module(tmp_path: Path) -> Path:
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / "broken_mlp.py").write_text(textwrap.dedent(BROKEN))
    return pkg


def _invoke(*args: str, path: Path) -> tuple[int, str, str]:
    """Runs the command in this process (warm JAX caches), ``path`` importable."""
    runner = CliRunner()
    sys.path.insert(0, str(path))
    try:
        result = runner.invoke(verify, list(args))
    finally:
        sys.path.remove(str(path))
        for name in [m for m in sys.modules if m.startswith(("broken_mlp", "fresh_mlp"))]:
            del sys.modules[name]
    return result.exit_code, result.stdout, result.stderr


def test_a_failing_check_exits_1(broken_module: Path) -> None:
    code, out, _ = _invoke(
        "broken_mlp:model",
        "--json",
        "--no-bench",
        "--report-dir",
        str(broken_module / "r"),
        path=broken_module,
    )
    assert code == 1
    data = json.loads(out)
    assert data["format"] == "treeguard.verify-report/1" and data["exit_code"] == 1
    assert [c["name"] for c in data["checks"] if c["status"] == "fail"] == ["training"]
    assert data["model"] == "broken_mlp:model"
    assert json.loads((broken_module / "r" / "report.json").read_text())["exit_code"] == 1


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "'no_colon' is not MODULE:ATTR"),
        ("no_such_module_xyz:model", "cannot import module 'no_such_module_xyz'"),
        (
            "broken_mlp:nope",
            "module 'broken_mlp' has no attribute 'nope' "
            "hint: the treeguard.verify.Model objects in broken_mlp are ['model']",
        ),
        ("broken_mlp:not_a_model", "broken_mlp:not_a_model is a int, not a treeguard.verify.Model"),
    ],
)
def test_usage_errors_exit_2(target: str, message: str, broken_module: Path) -> None:
    code, _, err = _invoke(
        target, "--no-bench", "--report-dir", str(broken_module / "r"), path=broken_module
    )
    assert code == 2
    assert message in " ".join(err.split())


def test_a_factory_function_is_accepted(broken_module: Path) -> None:
    code, out, _ = _invoke(
        "broken_mlp:make",
        "--no-bench",
        "--report-dir",
        str(broken_module / "r"),
        path=broken_module,
    )
    assert code == 0, out


RECORDABLE = """
import dataclasses
from pathlib import Path
from treeguard.examples import mlp

HERE = Path(__file__).parent
model = dataclasses.replace(
    mlp.model, references=HERE / "refs.safetensors", params_spec=HERE / "params.spec.json"
)
"""


@pytest.fixture
def fresh_module(tmp_path: Path) -> Path:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fresh_mlp.py").write_text(textwrap.dedent(RECORDABLE))
    return mods


def test_missing_references_exit_2_then_record_then_pass_then_corrupt(fresh_module: Path) -> None:
    report = ["--no-bench", "--report-dir", str(fresh_module / "r")]
    code, _, err = _invoke("fresh_mlp:model", *report, path=fresh_module)
    assert code == 2
    assert "no references at" in err and "--record" in err
    code, out, _ = _invoke("fresh_mlp:model", *report, "--record", path=fresh_module)
    assert code == 0, out
    assert "recorded references:" in out
    refs = references_of(
        fresh_module / "refs.safetensors", jax.default_backend()
    )  # the CPU's: as named
    assert refs.exists()
    assert (fresh_module / "params.spec.json").exists()
    code, out, _ = _invoke("fresh_mlp:model", *report, path=fresh_module)
    assert code == 0, out
    # A flipped byte in the references is a configuration error, not a failed check.
    data = bytearray(refs.read_bytes())
    data[-3] ^= 0xFF
    refs.write_bytes(bytes(data))
    code, _, err = _invoke("fresh_mlp:model", *report, path=fresh_module)
    assert code == 2
    assert err.startswith("error: ") and refs.name in err


def test_compile_fast_adds_each_flag_the_environment_does_not_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    from treeguard._cli.verify import compile_fast, fast_compile_flags

    chosen = fast_compile_flags(importlib.metadata.version("jaxlib"))
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2 --xla_foo=1")
    compile_fast()
    flags = os.environ["XLA_FLAGS"].split()
    assert flags[:2] == ["--xla_backend_optimization_level=2", "--xla_foo=1"]  # kept as set
    assert sorted(flags[2:]) == sorted(
        f"--{k}={v}" for k, v in chosen.items() if k != "xla_backend_optimization_level"
    )
    compile_fast()  # idempotent
    assert os.environ["XLA_FLAGS"].split() == flags


def test_this_xla_accepts_the_fast_compile_flags() -> None:
    # XLA aborts the process on a flag it does not know.
    import importlib.metadata

    from treeguard._cli.verify import fast_compile_flags

    chosen = fast_compile_flags(importlib.metadata.version("jaxlib"))
    flags = " ".join(f"--{k}={v}" for k, v in chosen.items())
    code = "import jax; print(jax.jit(lambda x: x + 1.0)(1.0))"
    proc = run_python(code, env={"XLA_FLAGS": flags})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2.0"
