"""What the diagnosis reads from JAX's equations, through ``locate``,
``record_trace`` and ``nan_origin``: each site's source line and the
transformations it went through (the name stack), inside ``jit`` bodies
(inlined in a recorded trace) and ``scan`` bodies.

If one of these fails after a JAX upgrade, JAX changed how equations record
where they came from (fix ``treeguard/_src/equation.py:site``) or how a
``scan`` equation lays out its inputs (fix
``treeguard/_src/diagnose/jaxpr.py:scan_split``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from treeguard.diagnose import Trace, locate, nan_origin, record_trace

from .faults import Perturbing, perturbing


def traced(x: jax.Array) -> jax.Array:
    return jnp.sin(x) * 2.0


def overflowing(x: jax.Array) -> jax.Array:
    return (x * 1e30) * 1e30


def _line(fn: object, offset: int = 1) -> int:
    return inspect.getsourcelines(fn)[1] + offset  # type: ignore[arg-type]


X = jnp.linspace(0.0, 1.0, 5)


def _in_transpose(e: Any, it: int | None, n: int) -> bool:
    return e.primitive.name == "mul" and "transpose" in str(e.source_info.name_stack)


def test_a_site_reads_the_user_line_and_the_name_stack() -> None:
    where = f"test_jaxpr.py:{_line(traced)} (traced)"
    grad = jax.grad(lambda x: jnp.sum(traced(x)))
    d = locate(grad, X, candidate=perturbing("cos"), check_precision=False)
    assert d.equation is not None
    assert (d.equation.primitive, d.equation.source, d.equation.name_stack) == (
        "cos",
        where,
        "jvp()",
    )
    d = locate(grad, X, candidate=Perturbing(_in_transpose), check_precision=False)
    assert d.equation is not None
    assert (d.equation.primitive, d.equation.source, d.equation.name_stack) == (
        "mul",
        where,
        "transpose(jvp())",
    )


def test_a_recorded_jit_body_is_inlined_each_equation_keeping_its_line(tmp_path: Path) -> None:
    path = record_trace(tmp_path / "t.safetensors", jax.jit(traced), X)
    where = f"test_jaxpr.py:{_line(traced)} (traced)"
    assert Trace.load(path).equations == {"0": ("sin", where), "1": ("mul", where)}


def test_a_nan_site_is_named_forward_and_backward() -> None:
    # at 0 the values stay finite and the gradient (1e60) overflows: a site of
    # the backward pass, known by its name stack (``transpose(jvp())``)
    where = f"test_jaxpr.py:{_line(overflowing)} (overflowing)"
    sites = nan_origin(lambda x: jnp.sum(overflowing(x)), jnp.zeros(2), grad=True)
    assert [(s.phase, s.primitive, s.kind, s.source) for s in sites] == [
        ("backward", "mul", "inf", where)
    ]
    both = nan_origin(lambda x: jnp.sum(overflowing(x)), jnp.ones(2), grad=True)
    assert [(s.phase, s.primitive, s.source) for s in both] == [
        ("forward", "mul", where),
        ("backward", "mul", where),
    ]
    inside = nan_origin(jax.jit(overflowing), -jnp.ones(2))
    assert [(s.index, s.primitive, s.source) for s in inside] == [("0/1", "mul", where)]


def scanned(x: jax.Array, w: jax.Array) -> Any:
    def body(c: Any, a: jax.Array) -> Any:
        return (c[0] - w, c[1] + a), jnp.log(c[0] * a) + c[1]

    return jax.lax.scan(body, (x, jnp.float32(0.0)), jnp.ones(5))


def test_a_site_in_a_scan_body_with_a_constant_and_two_carries_is_at_its_iteration() -> None:
    # one constant (w), two carries: c[0] goes 2.5, 1.5, 0.5, -0.5, -1.5, so the
    # log is NaN from finite inputs at iterations 3 and 4; a wrong split of the
    # inputs runs another loop
    sites = nan_origin(scanned, jnp.float32(2.5), jnp.float32(1.0))
    assert [(s.primitive, s.kind, s.summary) for s in sites] == [("log", "nan", "f32[]")] * 2
    assert [s.index.split("@")[1].split("/")[0] for s in sites] == ["3", "4"]
    body = f"test_jaxpr.py:{_line(scanned, 2)} (scanned.<locals>.body)"
    assert {s.source for s in sites} == {body}
