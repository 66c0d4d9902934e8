"""The one place that reads JAX's source info, and the jaxpr cuts.

If one of these fails after a JAX upgrade, JAX changed how equations record
where they came from: fix ``treeguard/_src/diagnose/jaxpr.py:site``.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp

# The private module on purpose: it isolates the reads of JAX internals that have
# no public API, and these tests fail loudly when a JAX release moves them.
from treeguard._src.diagnose import jaxpr as jx  # _src: jaxpr walking
from treeguard._src.equation import site  # _src: the one reader of JAX's source info


def traced(x: jax.Array) -> jax.Array:
    return jnp.sin(x) * 2.0


def test_site_reads_the_user_line_and_the_name_stack_through_public_jax() -> None:
    line = inspect.getsourcelines(traced)[1] + 1
    eqns = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(traced(x))))(jnp.ones(2)).jaxpr.eqns
    assert site(eqns[0]) == (f"test_jaxpr.py:{line} (traced)", "jvp()")
    assert any(site(e)[1] == "transpose(jvp())" for e in eqns)


def test_inlining_keeps_each_equations_source_line() -> None:
    closed = jax.make_jaxpr(jax.jit(traced))(jnp.ones(2))
    assert [e.primitive.name for e in closed.jaxpr.eqns] == ["jit"]
    flat = jx.inline_calls(closed, [jnp.ones(2)])
    line = inspect.getsourcelines(traced)[1] + 1
    assert [(e.primitive.name, site(e)[0]) for e in flat.jaxpr.eqns] == [
        ("sin", f"test_jaxpr.py:{line} (traced)"),
        ("mul", f"test_jaxpr.py:{line} (traced)"),
    ]


def test_live_values_at_a_cut() -> None:
    def f(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        a = jnp.sin(x)
        b = jnp.cos(x)
        return a * b, a

    j = jax.make_jaxpr(f)(1.0).jaxpr
    a, b = j.eqns[0].outvars[0], j.eqns[1].outvars[0]
    assert jx.live_at(j, 0) == []
    assert jx.live_at(j, 2) == [a, b]
    assert jx.live_at(j, 3) == [j.eqns[2].outvars[0], a]


def test_scan_split_reads_this_jax_versions_scan_equation() -> None:
    def f(x, w, v):
        def body(c, a):
            return (c[0] * w * v + a[0] + a[1], c[1] + 1.0), c[0]

        return jax.lax.scan(body, (x, x), (jnp.arange(3.0), jnp.ones(3)))

    eqn = jax.make_jaxpr(f)(1.0, 2.0, 3.0).jaxpr.eqns[-1]
    assert eqn.primitive.name == "scan"
    assert jx.scan_split(eqn.params) == (2, 2)  # w and v; the two carries
