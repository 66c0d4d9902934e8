"""``nan_origin``: every equation where a NaN or an infinity is born."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp

from treeguard.diagnose import nan_origin


def _line(fn: object, offset: int) -> int:
    return inspect.getsourcelines(fn)[1] + offset  # type: ignore[arg-type]


def log_shifted(x: jax.Array) -> jax.Array:
    y = x * 2.0
    return jnp.log(x - 2.0) + y


def test_log_of_x_minus_two_is_born_at_log_with_its_line() -> None:
    sites = nan_origin(log_shifted, jnp.linspace(0.0, 1.0, 4))
    assert len(sites) == 1
    s = sites[0]
    assert (s.primitive, s.phase, s.kind, s.count, s.summary) == (
        "log",
        "forward",
        "nan",
        4,
        "f32[4]",
    )
    assert s.source == f"test_nan.py:{_line(log_shifted, 2)} (log_shifted)"
    assert not s.masked  # the NaN reaches the output
    assert s.describe() == (
        f"forward equation 2 (log) at test_nan.py:{_line(log_shifted, 2)} (log_shifted): "
        "4 nan in f32[4] from finite inputs f32[4]"
    )


def safe_log_sum(x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(x > 0, jnp.log(x), 0.0))


def test_a_where_masked_nan_that_poisons_the_gradient_is_flagged() -> None:
    x = jnp.array([0.0, 1.0, 2.0])
    assert bool(jnp.isfinite(safe_log_sum(x)))  # the forward value looks fine
    sites = nan_origin(safe_log_sum, x, grad=True)
    fwd = [s for s in sites if s.phase == "forward"]
    bwd = [s for s in sites if s.phase == "backward"]
    assert [(s.primitive, s.kind, s.masked, s.poisons_gradient) for s in fwd] == [
        ("log", "inf", True, True)
    ]
    assert fwd[0].source == f"test_nan.py:{_line(safe_log_sum, 1)} (safe_log_sum)"
    assert [(s.primitive, s.kind) for s in bwd] == [("div", "nan")]
    assert "poisons the gradient" in fwd[0].describe()


def test_it_never_halts_at_the_first_site_and_follows_loops() -> None:
    def body(c: jax.Array, x: jax.Array) -> tuple[jax.Array, None]:
        return c + jnp.sqrt(x - 0.5), None

    def f(xs: jax.Array) -> jax.Array:
        total = jax.lax.scan(body, jnp.float32(0.0), xs)[0]
        return total + 1.0 / (xs[0] - xs[0])

    sites = nan_origin(jax.jit(f), jnp.linspace(0.0, 1.0, 4))
    assert [(s.index, s.primitive, s.kind) for s in sites] == [
        ("0/0@0/1", "sqrt", "nan"),
        ("0/0@1/1", "sqrt", "nan"),
        ("0/6", "div", "inf"),  # 1 / 0
    ]


def test_a_finite_function_has_no_sites() -> None:
    assert nan_origin(lambda x: jnp.sum(jnp.tanh(x)), jnp.ones(3), grad=True) == []
