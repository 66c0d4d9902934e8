"""``treeguard bench``: the default command, files, compare's and ab's exit codes."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from benchresults import ran
from click.testing import CliRunner

from treeguard._cli.main import main
from treeguard.bench import BenchResult, save_results

TARGETS = """
import jax.numpy as jnp
from treeguard.bench import Target

sine = Target(jnp.sin, (jnp.ones(8),), name="sine")
cosine = Target(jnp.cos, (jnp.ones(8),), name="cosine")
not_a_target = 3
"""


@pytest.fixture
def targets(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "bench_targets.py").write_text(textwrap.dedent(TARGETS))
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("bench_targets", None)


def _bench(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["bench", *args])
    return r.exit_code, r.stdout, r.stderr


FAST = ("--samples", "3", "--min-time", "0")


@pytest.mark.slow
def test_bench_model_prints_distribution_phases_and_conditions(tmp_path: Path) -> None:
    code, out, _ = _bench(
        "treeguard.examples.mlp:model",
        "--batch-sizes",
        "2",
        *FAST,
        "--json",
        str(tmp_path / "b.json"),
        "--html",
        str(tmp_path / "b.html"),
    )
    assert code == 0, out
    for word in ("median", "95% CI", "p95", "trace", "compile", "1st call", "temp", "machine:"):
        assert word in out
    for name in ("apply B=2", "loss+grad B=2", "update"):
        assert name in out
    assert "jax " in out and "XLA_FLAGS" in out
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["format"] == "treeguard.bench/1"
    assert [r["name"] for r in doc["results"]] == ["apply B=2", "loss+grad B=2", "update"]
    assert "<svg" in (tmp_path / "b.html").read_text()


def test_bench_target_and_bench_run_target(targets: Path, tmp_path: Path) -> None:
    j, h = tmp_path / "s.json", tmp_path / "s.html"
    code, out, _ = _bench("bench_targets:sine", *FAST, "--json", str(j), "--html", str(h))
    assert code == 0, out
    for word in ("median", "95% CI", "p95", "trace", "compile", "1st call", "temp", "machine:"):
        assert word in out
    assert f"results: {j}" in out and f"report: {h}" in out
    assert json.loads(j.read_text())["results"][0]["name"] == "sine"
    assert "<svg" in h.read_text()
    code, out, _ = _bench("run", "bench_targets:sine", *FAST)
    assert code == 0 and "sine" in out


def _result(rng: np.random.Generator, scale: float = 1.0) -> BenchResult:
    offset = rng.lognormal(0, 0.05)  # this process's own offset
    samples = 1e-3 * scale * offset * rng.lognormal(0, 0.01, 30)
    conditions = {"cpu_model": "Test CPU", "usable_cores": 2, "backend": "cpu"}
    return dataclasses.replace(
        ran(samples, conditions),
        loops=10,
        warmup=2,
        phases={"trace_s": 0.01, "lower_s": 0.01, "compile_s": 0.1, "first_call_s": 0.001},
        compiles={"warmup": {"compile": 1}, "measure": {"compile": 0}},
    )


def _save(path: Path, scale: float = 1.0, *, runs: int = 1, seed: int = 0, **edit: object) -> Path:
    """Generated results: ``runs`` runs of benchmark ``f`` (no clock is read)."""
    rng = np.random.default_rng(seed)
    doc_path = save_results(path, [_result(rng, scale) for _ in range(runs)])
    if edit:
        doc = json.loads(doc_path.read_text())
        for key, value in edit.items():
            if key == "cpu_model":
                doc["conditions"]["cpu_model"] = value
            else:
                for r in doc["results"]:
                    r[key] = value
        doc_path.write_text(json.dumps(doc))
    return doc_path


def _save_dir(path: Path, scale: float, *, runs: int, seed: int) -> Path:
    """One file per run, as ``bench run --json DIR/runN.json`` writes them."""
    path.mkdir()
    for i in range(runs):
        _save(path / f"run{i}.json", scale, seed=seed * 1000 + i)
    return path


def test_compare_exit_codes_across_runs(tmp_path: Path) -> None:
    base = _save(tmp_path / "a.json", runs=12, seed=1)  # one file holding 12 runs
    same = _save_dir(tmp_path / "same", 1.0, runs=12, seed=2)  # a directory of 12 runs
    slower = _save_dir(tmp_path / "slow", 1.3, runs=12, seed=3)
    code, out, _ = _bench("compare", str(base), str(same))
    assert code == 0 and "regression" not in out
    code, out, _ = _bench("compare", str(base), str(slower))
    assert code == 1 and "regression" in out and "12/12" in out
    code, out, _ = _bench("compare", str(slower), str(base))
    assert code == 0 and "improvement" in out
    code, out, _ = _bench("compare", str(base), str(slower), "--json")
    doc = json.loads(out)["comparisons"][0]
    assert code == 1 and doc["verdict"] == "regression" and doc["test"] == "mann-whitney-runs"


def test_compare_of_one_run_per_side_is_inconclusive(tmp_path: Path) -> None:
    # Two single runs whose samples differ by 20%: within a process that
    # looks certain, but one run per side says nothing of the next process.
    base = _save(tmp_path / "a.json", seed=1)
    slower = _save(tmp_path / "b.json", 1.2, seed=2)
    code, out, _ = _bench("compare", str(base), str(slower))
    assert code == 0 and "inconclusive" in out and "regression" not in out
    assert "f: too few samples to call (1 and 1; at least 9 runs per side)" in out


def test_compare_refuses_other_machines_unless_allowed(tmp_path: Path) -> None:
    base = _save(tmp_path / "a.json")
    other = _save(tmp_path / "o.json", cpu_model="Other CPU")
    code, _, err = _bench("compare", str(base), str(other))
    assert code == 2
    assert "cpu_model: 'Test CPU' in the base, 'Other CPU' in the candidate" in err
    code, out, _ = _bench("compare", str(base), str(other), "--allow-different-machines")
    assert code == 0 and "inconclusive" in out


def test_compare_an_invalid_result_fails(tmp_path: Path) -> None:
    base = _save(tmp_path / "a.json")
    bad = _save(
        tmp_path / "b.json", status="invalid", reason="2 compile(s) during the timed samples"
    )
    code, out, _ = _bench("compare", str(base), str(bad))
    assert code == 1 and "invalid" in out and "2 compile(s)" in out


def test_compare_usage_errors(tmp_path: Path) -> None:
    base = _save(tmp_path / "a.json")
    (tmp_path / "junk.json").write_text("{")
    code, _, err = _bench("compare", str(base), str(tmp_path / "junk.json"))
    assert code == 2 and "the benchmark file is not valid JSON" in err
    code, _, err = _bench("compare", str(base), str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json: no such file" in err
    other = _save(tmp_path / "n.json", name="g")
    code, _, err = _bench("compare", str(base), str(other))
    assert code == 2 and "share no benchmark name" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _bench("compare", str(base), str(tmp_path / "empty"))
    assert code == 2 and "no *.json results in the directory" in err


def test_ab_gives_the_verdict_and_its_exit_code(targets: Path, tmp_path: Path) -> None:
    # The verdict itself is tested on a fake clock (test_ab.py); here, that the
    # command reports it, writes it, and exits with its code, whatever it is.
    args = ("--rounds", "10", "--min-time", "0", "--json", str(tmp_path / "ab.json"))
    code, out, _ = _bench("ab", "bench_targets:sine", "bench_targets:cosine", *args)
    doc = json.loads((tmp_path / "ab.json").read_text())
    verdict = doc["ab"]["verdict"]
    assert code == (1 if verdict in ("regression", "invalid") else 0), out
    assert verdict in out and "ABBA" in out and len(doc["results"]) == 2
    assert [r["name"] for r in doc["results"]] == ["bench_targets:sine", "bench_targets:cosine"]


@pytest.mark.slow
def test_run_in_fresh_processes_keeps_every_run(
    targets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(targets)  # the children find bench_targets beside their cwd
    out_file = tmp_path / "runs.json"
    code, out, err = _bench(
        "bench_targets:sine", "--processes", "2", *FAST, "--json", str(out_file)
    )
    assert code == 0, out + err
    assert "(2 processes)" in out
    doc = json.loads(out_file.read_text())
    assert [(r["name"], r["meta"]["process"]) for r in doc["results"]] == [
        ("sine", 0),
        ("sine", 1),
    ]
    code, out, _ = _bench("compare", str(out_file), str(out_file))
    assert code == 0 and "2 and 2; at least 9 runs per side" in out


@pytest.mark.slow
def test_ab_on_models(targets: Path) -> None:
    m = "treeguard.examples.mlp:model"
    code, out, _ = _bench("ab", m, m, "--rounds", "3", "--min-time", "0")
    assert code in (0, 1) and "B against A" in out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nocolon", "'nocolon' is not MODULE:ATTR"),
        ("no_such_module_xyz:m", "cannot import module 'no_such_module_xyz'"),
        ("bench_targets:nope", "module 'bench_targets' has no attribute 'nope'"),
        ("bench_targets:not_a_target", "bench_targets:not_a_target is a int, not a"),
    ],
)
def test_usage_errors_exit_2(targets: Path, target: str, message: str) -> None:
    code, _, err = _bench(target, *FAST)
    assert code == 2 and message in " ".join(err.split())


def test_bad_batch_sizes_exit_2() -> None:
    code, _, err = _bench("treeguard.examples.mlp:model", "--batch-sizes", "0,x")
    assert code == 2 and "expected positive ints" in err


def test_help_lists_the_commands() -> None:
    code, out, _ = _bench("--help")
    assert code == 0 and all(c in out for c in ("run", "compare", "ab"))
