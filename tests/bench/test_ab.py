"""The interleaved A/B: ABBA order, one loop count, a verdict that sees a known difference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeguard.bench as bench
from treeguard.bench import BenchError, Timer, ab


class FakeDevice:
    """A device whose calls take generated durations on a fake clock: each
    call advances both clocks by its duration (lognormal noise around its
    mean), so a verdict depends on the samples, never on the machine."""

    def __init__(self, seed: int = 0) -> None:
        self.now = 0.0
        self.rng = np.random.default_rng(seed)
        self.timer = Timer(wall=lambda: self.now, cpu=lambda: self.now)

    def function(self, mean_s: float, noise: float = 0.05):  # type: ignore[no-untyped-def]
        def call() -> jax.Array:
            self.now += mean_s * float(self.rng.lognormal(0.0, noise))
            return jnp.ones(2)

        return call


def test_the_samples_alternate_abba() -> None:
    log: list[str] = []
    f = jax.jit(lambda x: x + 1)

    def a() -> jax.Array:
        log.append("a")
        return f(jnp.ones(2))

    def b() -> jax.Array:
        log.append("b")
        return f(jnp.ones(2))

    r = ab(a, b, rounds=3, min_time=0.0, warmup=0, jit=False)
    assert "".join(log[-12:]) == "abba" * 3
    assert (len(r.a.samples_s), len(r.b.samples_s), r.a.loops, r.rounds) == (6, 6, 1, 3)
    assert r.a.meta == {"ab": "ABBA", "rounds": 3}


def test_a_known_difference_gets_the_right_verdict() -> None:
    device = FakeDevice()
    fast, slow = device.function(0.001), device.function(0.006)
    kw = {"rounds": 10, "min_time": 0.0, "warmup": 1, "jit": False, "timer": device.timer}
    r = ab(fast, slow, names=("fast", "slow"), clock="wall", **kw)
    assert r.verdict == "regression", r.comparison.describe()
    assert r.comparison.ratio == pytest.approx(6.0, rel=0.1)
    assert (r.a.name, r.b.name) == ("fast", "slow")
    back = ab(slow, fast, clock="cpu", **kw)
    assert back.verdict == "improvement", back.comparison.describe()
    assert back.a.name.startswith("A ") and back.b.name.startswith("B ")
    same = ab(fast, device.function(0.001), clock="wall", **kw)
    assert same.verdict in ("no_change", "inconclusive"), same.comparison.describe()


def test_a_compile_during_the_ab_window_invalidates_both() -> None:
    inner = jax.jit(lambda x: x.sum())
    n = {"calls": 0}

    def ragged() -> jax.Array:
        n["calls"] += 1
        return inner(np.ones(n["calls"] if n["calls"] > 3 else 1, np.float32))

    r = ab(ragged, lambda: inner(np.ones(1, np.float32)), rounds=3, min_time=0.0, jit=False)
    assert r.verdict == "invalid" and not r.a.valid and not r.b.valid


def test_bad_rounds_and_clock() -> None:
    with pytest.raises(BenchError, match=r"^rounds=0\nhint: pass an int >= 1"):
        ab(jnp.sin, jnp.cos, jnp.ones(2), rounds=0)
    with pytest.raises(BenchError, match=r"^clock='gpu'\nhint: 'auto', 'wall' or 'cpu'$"):
        ab(jnp.sin, jnp.cos, jnp.ones(2), clock="gpu")


def test_the_auto_clock_is_cpu_time_on_the_cpu_backend_and_wall_time_elsewhere() -> None:
    r = ab(jnp.sin, jnp.sin, jnp.ones(64), rounds=9, min_time=0.0)
    # on an accelerator the host's CPU time misses the device's work
    clock = "cpu" if jax.default_backend() == "cpu" else "wall"
    assert (r.comparison.clock, r.comparison.test) == (clock, "wilcoxon-paired")
    assert (r.comparison.n_base, r.comparison.n_cand) == (9, 9)  # rounds, as pairs


def test_all_matches_the_exports() -> None:
    public = {
        n
        for n, v in vars(bench).items()
        if not n.startswith("_") and not isinstance(v, type(bench))
    }
    assert sorted(bench.__all__) == bench.__all__
    assert set(bench.__all__) == public
    for name in bench.__all__:
        assert getattr(bench, name).__doc__, name
