"""verify's benchmark goes through bench.run, and the optional performance
check fails with evidence when a budget is exceeded."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from onecheck import generate_cases, one_check

from treeguard import ConfigError
from treeguard.bench import BenchError, Budgets, run
from treeguard.examples.mlp import model
from treeguard.verify import run as verify


def _check(m: object, bench_result: object = None) -> object:
    """The performance check alone, on the model's generated cases."""
    return one_check("performance", m, bench_result=bench_result)  # type: ignore[arg-type]


def test_a_model_without_budgets_skips_the_check() -> None:
    result = _check(model)
    assert (result.status, result.summary) == (  # type: ignore[attr-defined]
        "skip",
        "the model declares no performance budgets",
    )


def test_the_check_holds_the_benchmark_to_the_budgets() -> None:
    batch = jax.tree.map(jnp.asarray, generate_cases(model)[0].batch)
    measured = run(
        model.apply, model.init(model.key()), batch, samples=3, min_time=0.0, name="jit(apply)"
    )
    # the same verdict at any speed and on any backend (a TPU's program needs no temp buffer)
    memory = {**(measured.memory or {}), "temp": 160}
    r = dataclasses.replace(measured, samples_s=(1e-3, 2e-3, 3e-3), memory=memory)
    ok = _check(dataclasses.replace(model, performance=Budgets(p95_s=60.0)), r)
    assert ok.status == "pass" and ok.summary == "within p95 <= 60 s"  # type: ignore[attr-defined]
    bad = _check(dataclasses.replace(model, performance=Budgets(temp_bytes=1)), r)
    assert bad.status == "fail"  # type: ignore[attr-defined]
    assert bad.evidence[0] == (  # type: ignore[attr-defined]
        "jit(apply): temp 160 B (160 bytes) over the budget 1 B (1 bytes)"
    )
    invalid = dataclasses.replace(
        r, status="invalid", reason="1 compile(s) during the timed samples"
    )
    worse = _check(dataclasses.replace(model, performance=Budgets(p95_s=60.0)), invalid)
    assert worse.status == "fail"  # type: ignore[attr-defined]
    assert worse.evidence[0] == "jit(apply): invalid: 1 compile(s) during the timed samples"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_exceeded_budgets_fail_a_verify_run_with_evidence() -> None:
    tight = dataclasses.replace(model, performance=Budgets(p95_s=0.0, temp_bytes=1, compile_s=0.0))
    report = verify(tight, bench=False)  # budgets make verify benchmark anyway
    perf = report["performance"]
    assert perf.status == "fail" and report.exit_code == 1 and report.failed == ["performance"]
    assert perf.summary == "3 performance budget(s) exceeded"
    assert re.match(
        r"jit\(apply\): compile .* \(trace .*, lower .*, compile .*\) over the budget 0 µs$",
        perf.evidence[0],
    )
    assert re.match(
        r"jit\(apply\): p95 .* over the budget 0 µs \(median .*, 20 samples of \d+ call\(s\)\)$",
        perf.evidence[1],
    )
    assert perf.evidence[2] == "jit(apply): temp 160 B (160 bytes) over the budget 1 B (1 bytes)"
    assert "jit(apply) on ['x']: f32[8,2], ['y']: f32[8,1]: median" in perf.evidence[3]
    bench_json = report.to_dict()["benchmark"]
    assert bench_json["bench"]["status"] == "ok" and len(bench_json["latencies_s"]) == 20
    assert bench_json["bench"]["memory"]["temp"] == 160


def test_generous_budgets_pass() -> None:
    measured = run(jnp.sin, jnp.ones(8), samples=3, min_time=0.0)
    phases = {"trace_s": 0.1, "lower_s": 0.1, "compile_s": 0.3, "first_call_s": 0.1}
    r = dataclasses.replace(measured, samples_s=(1e-3, 2e-3, 3e-3), phases=phases)
    assert Budgets(compile_s=600.0, p95_s=60.0, temp_bytes=2**40).violations(r) == []


def test_a_budget_the_backend_cannot_check_is_a_violation() -> None:
    r = dataclasses.replace(run(jnp.sin, jnp.ones(8), samples=3, min_time=0.0), memory=None)
    assert Budgets(temp_bytes=10).violations(r) == [
        "sin: the backend gives no memory analysis, so the temp budget 10 B cannot be checked"
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"p95_s": -1.0}, "Budgets.p95_s is -1.0\nhint: a budget is >= 0"),
        (
            {"temp_bytes": float("nan")},
            "Budgets.temp_bytes is nan\nhint: a finite number >= 0, or None",
        ),
        ({"compile_s": True}, "Budgets.compile_s is True\nhint: a finite number >= 0, or None"),
    ],
)
def test_bad_budgets(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(BenchError, match="^" + re.escape(message) + "$"):
        Budgets(**kwargs)  # type: ignore[arg-type]


def test_the_model_refuses_budgets_of_another_type() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^Model.performance is \{'p95_s': 1\}; hint: use treeguard.bench.Budgets",
    ):
        dataclasses.replace(model, performance={"p95_s": 1})  # type: ignore[arg-type]
