"""The shared programs: prepared ahead, they leave the checks nothing to
compile and nothing to run eagerly twice, and what fails while preparing
fails again in the check that needs it."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import pytest
from onecheck import context

from treeguard.examples import mlp
from treeguard.verify import run

BASE = mlp.model


def test_prepare_leaves_the_checks_nothing_to_compile(caplog: pytest.LogCaptureFixture) -> None:
    concrete_calls = []

    def apply(params: Any, batch: Any) -> Any:
        if not isinstance(batch["x"], jax.core.Tracer):
            concrete_calls.append(batch["x"].shape)
        return mlp.apply(params, batch)

    ctx = context(dataclasses.replace(BASE, apply=apply))
    ctx.prepare()
    assert concrete_calls == [(8, 2)]  # the eager reference, on the standard case
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        for case in ctx.positive:
            ctx.programs.results(case)
            ctx.programs.vmapped(case)
        ctx.programs.eager(ctx.standard())
        ctx.programs.opt_state()
    compiled = [r.getMessage() for r in caplog.records if "XLA compilation" in r.getMessage()]
    assert compiled == []
    assert concrete_calls == [(8, 2)]  # kept, not run again


def _apply_refusing_concrete_values(params: Any, batch: Any) -> Any:
    if not isinstance(batch["x"], jax.core.Tracer):
        raise RuntimeError("eager execution is not supported")
    return mlp.apply(params, batch)


def test_a_failure_while_preparing_fails_the_check_that_needs_it() -> None:
    report = run(dataclasses.replace(BASE, apply=_apply_refusing_concrete_values), bench=False)
    assert report["transforms"].evidence == ["RuntimeError: eager execution is not supported"]
    assert report["contract"].status == "pass"
    assert report.failed == ["negative", "transforms"]  # the invalid case raises it too


def test_only_options_this_xla_knows_are_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiler options alone, on purpose: an option this XLA lacks cannot be
    # made to appear through a public call.
    from treeguard._src.verify import programs  # _src: XLA options a public call cannot fake

    programs._known_cpu_options.cache_clear()
    monkeypatch.setitem(programs.CPU_COMPILER_OPTIONS, "xla_no_such_option_anywhere", 1)
    try:
        options = programs.compiler_options()
    finally:
        programs._known_cpu_options.cache_clear()
    assert "xla_no_such_option_anywhere" not in options
    assert options["xla_backend_optimization_level"] == 0
    compiled = jax.jit(lambda x: x * 2, compiler_options=options)
    assert float(compiled(jax.numpy.float32(3))) == 6.0
