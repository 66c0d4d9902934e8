"""``locate``: the first diverging equation, its role, and honest outcomes."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import pytest
from machine import cpu_devices

from treeguard.diagnose import DiagnosisError, TolerancePolicy, locate
from treeguard.verify import Tolerance

from .faults import degrading_matmuls, perturbing, perturbing_in_context


def _line(fn: object, offset: int) -> int:
    return inspect.getsourcelines(fn)[1] + offset  # type: ignore[arg-type]


def model_fn(x: jax.Array) -> dict[str, jax.Array]:
    a = jnp.cos(x)
    b = jnp.sin(a) * 3.0
    c = jnp.exp(b)
    return {"y": c.sum(), "z": a}


X = jnp.linspace(0.0, 1.0, 5)


def test_an_injected_fault_is_found_at_its_equation_as_the_culprit() -> None:
    d = locate(model_fn, X, candidate=perturbing("sin"))
    assert d.outcome == "located" and d.exit_code == 1
    assert d.equation is not None
    assert (d.equation.index, d.equation.primitive, d.equation.role) == ("1", "sin", "culprit")
    assert d.equation.source == f"test_locate.py:{_line(model_fn, 2)} (model_fn)"
    assert d.reaches == ("['y']",)  # ['z'] is upstream of the fault
    assert [e.path for e in d.leaves if not e.ok] == ["['y']"]
    assert d.equation.text == "sin(f32[5]) -> f32[5]"


def test_equations_downstream_of_the_culprit_are_propagators() -> None:
    d = locate(model_fn, X, candidate=perturbing("sin"), check_precision=False)
    assert [(p.primitive, p.role) for p in d.propagators] == [
        ("mul", "propagator"),
        ("exp", "propagator"),
        ("reduce_sum", "propagator"),
    ]


def test_a_second_fault_downstream_is_a_culprit_too() -> None:
    backend = perturbing("sin")
    hit = backend.hit
    backend.hit = lambda e, it, n: hit(e, it, n) or e.primitive.name == "exp"
    d = locate(model_fn, X, candidate=backend, check_precision=False)
    assert d.equation is not None and d.equation.primitive == "sin"
    assert [(p.primitive, p.role) for p in d.propagators] == [
        ("mul", "propagator"),
        ("exp", "culprit"),
        ("reduce_sum", "propagator"),
    ]


def scan_fn(xs: jax.Array) -> tuple[jax.Array, jax.Array]:
    def body(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return c + jnp.sin(x) * c, jnp.tanh(x)

    return jax.lax.scan(body, jnp.float32(1.0), xs)


def test_a_fault_inside_a_scan_body_is_found_at_its_iteration() -> None:
    d = locate(
        scan_fn,
        jnp.linspace(0.0, 1.0, 8),
        candidate=perturbing("sin", iteration=5),
        check_precision=False,
    )
    assert d.outcome == "located"
    assert [s.primitive for s in d.enclosing] == ["scan"]
    e = d.equation
    assert e is not None
    assert (e.index, e.primitive, e.iteration, e.role) == ("0@5/0", "sin", 5, "culprit")
    assert e.source == f"test_locate.py:{_line(scan_fn, 2)} (scan_fn.<locals>.body)"
    assert d.reaches == ("[0]",)  # the carry, not the tanh outputs
    assert "loop 0: first diverging iteration 5 of 8" in d.notes


def while_fn(x: jax.Array) -> jax.Array:
    def body(c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        return c[0] + 1, c[1] * 0.5 + jnp.sin(c[1])

    return jax.lax.while_loop(lambda c: c[0] < 6, body, (jnp.int32(0), x))[1]


def test_a_fault_inside_a_while_body_is_found_at_its_iteration() -> None:
    backend = perturbing("sin", iteration=3)
    d = locate(while_fn, X, candidate=backend, check_precision=False)
    assert [s.primitive for s in d.enclosing] == ["while"]
    e = d.equation
    assert e is not None
    assert (e.primitive, e.iteration, e.role) == ("sin", 3, "culprit")
    assert e.index.startswith("0@3/")


def test_a_fault_inside_a_custom_jvp_body_is_found_there() -> None:
    d = locate(lambda x: jax.nn.relu(x - 0.5) * 2.0, X, candidate=perturbing("max"))
    assert [s.primitive for s in d.enclosing] == ["custom_jvp_call", "jit"]
    assert d.equation is not None and (d.equation.primitive, d.equation.role) == ("max", "culprit")


def cond_fn(x: jax.Array) -> jax.Array:
    return jax.lax.cond(x.sum() > 0, lambda y: jnp.sin(y) * 2.0, lambda y: y - 1.0, x)


def test_a_fault_inside_a_cond_branch_and_a_jit_is_found_there() -> None:
    d = locate(jax.jit(cond_fn), X, candidate=perturbing("sin"))
    assert [s.primitive for s in d.enclosing] == ["jit", "cond"]
    e = d.equation
    assert e is not None
    assert (e.index, e.primitive, e.role) == ("0/3/branch1/0", "sin", "culprit")
    assert e.source == f"test_locate.py:{_line(cond_fn, 1)} (cond_fn.<locals>.<lambda>)"


def test_without_descending_the_enclosing_equation_is_reported() -> None:
    d = locate(jax.jit(cond_fn), X, candidate=perturbing("sin"), descend=False)
    assert d.enclosing == ()
    assert d.equation is not None and (d.equation.index, d.equation.primitive) == ("0", "jit")


def test_a_divergence_that_exists_only_in_context_vanishes_when_cut() -> None:
    d = locate(model_fn, X, candidate=perturbing_in_context("sin"))
    assert d.outcome == "vanishes" and d.exit_code == 3
    assert d.classification == "fusion"
    assert d.equation is not None and d.equation.role == "fused"
    assert any("not alone on the reference's inputs" in n for n in d.notes)


def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w)


def test_a_divergence_gone_at_highest_precision_is_classified_precision() -> None:
    # the candidate rounds matmuls as a TPU does, against an eager reference at
    # the CPU's full precision: on a TPU the reference would round them too
    with jax.default_device(cpu_devices(1)[0]):
        x = jnp.linspace(-1.0, 1.0, 48).reshape(6, 8) * 1.37
        w = jnp.linspace(0.3, 1.1, 32).reshape(8, 4)
        d = locate(dense, x, w, candidate=degrading_matmuls)
    assert d.outcome == "located"
    assert d.classification == "precision"
    assert d.equation is not None and d.equation.primitive == "dot_general"
    assert any("highest" in n for n in d.notes)


def test_no_divergence_under_jit_exits_zero() -> None:
    d = locate(model_fn, X)
    assert (d.outcome, d.exit_code, d.equation) == ("none", 0, None)
    assert d.describe() == "jit vs eager: no divergence on 2 output leaves"


def _shifted_under_jit(x: jax.Array) -> jax.Array:
    if isinstance(x, jax.core.Tracer):  # a branch taken only while tracing
        return jnp.sin(x) + 1e-3
    return jnp.sin(x)


def test_a_branch_taken_only_while_tracing_is_a_trace_divergence() -> None:
    d = locate(_shifted_under_jit, X)
    assert d.outcome == "trace" and d.exit_code == 1 and d.classification == "trace"
    assert d.equation is None  # the eager run has no equations to pair with
    assert any("a Python branch taken only while tracing" in n for n in d.notes)


@pytest.mark.slow
def test_vmap_and_grad_candidates_agree_on_a_sound_function() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(x) ** 2)

    batch = jnp.linspace(0.0, 1.0, 6).reshape(3, 2)
    assert locate(f, batch, candidate="jit+vmap").outcome == "none"
    assert locate(f, X, candidate="jit+grad").outcome == "none"


def test_a_per_path_tolerance_decides_which_outputs_count() -> None:
    loose = TolerancePolicy(paths=[("*['y']", Tolerance(0.0, 10.0))])
    d = locate(model_fn, X, candidate=perturbing("sin"), tolerances=loose, check_precision=False)
    assert d.outcome == "none"
    assert d.tolerances["paths"] == [["*['y']", {"rtol": 0.0, "atol": 10.0}]]


def test_an_unknown_candidate_is_refused_with_the_choices() -> None:
    with pytest.raises(DiagnosisError) as e:
        locate(model_fn, X, candidate="fast")
    assert str(e.value).startswith(
        "unknown candidate 'fast'\nhint: one of jit, vmap, jit+vmap, grad, jit+grad, a matmul "
        "precision (default, high, highest, bfloat16, tensorfloat32, float32)"
    )


def _summed(x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.sin(x) * 1.1)


def _one_ulp_up(closed: Any, args: Sequence[Any]) -> list[Any]:
    """Compiled, with every scalar output one ulp higher: no worse than eager's own error."""
    return [
        jnp.nextafter(o, jnp.inf) if o.ndim == 0 else o
        for o in jax.jit(jex.jaxpr_as_fun(closed))(*args)
    ]


def _a_thousandth_up(closed: Any, args: Sequence[Any]) -> list[Any]:
    """Compiled, with every scalar output 0.1% higher: far worse than eager's own error."""
    return [o * 1.001 if o.ndim == 0 else o for o in jax.jit(jex.jaxpr_as_fun(closed))(*args)]


def test_the_fp64_rule_accepts_a_candidate_as_close_to_fp64_as_the_reference() -> None:
    x = jnp.linspace(0.0, 3.0, 10001)
    strict = TolerancePolicy(default=Tolerance(0.0, 0.0))
    d = locate(_summed, x, candidate=_one_ulp_up, tolerances=strict, descend=False)
    assert d.outcome != "none"
    # jit's sum may use another reduction order than eager's (it does from jax 0.11): its
    # error against fp64 is then up to about 4x eager's, within 5x.
    relative = dataclasses.replace(strict, fp64=5.0)
    assert locate(_summed, x, candidate=_one_ulp_up, tolerances=relative).outcome == "none"
    # the rule's refusal: an error against fp64 many times the reference's still diverges
    worse = locate(_summed, x, candidate=_a_thousandth_up, tolerances=relative, descend=False)
    assert worse.outcome != "none" and [e.path for e in worse.leaves if not e.ok] == [""]


def test_a_backend_that_drops_outputs_is_refused() -> None:
    with pytest.raises(DiagnosisError, match="returned 0 outputs for a program of 2"):
        locate(model_fn, X, candidate=lambda closed, args: [])
