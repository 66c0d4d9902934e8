"""The measurement protocol: awaited samples, phases apart, compiles in the
timed window invalidate, result files round-trip and refuse hostile input.

No test reads its own clock: assertions are on the samples the runner
recorded, against the sleep a fake device is known to take.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from treeguard import FormatError
from treeguard.bench import BenchError, Timer, load_results, run, save_results, to_html

SLEEP = 0.004


def _sleep(x: np.ndarray) -> np.ndarray:
    time.sleep(SLEEP)
    return x


@jax.jit
def slow_device(x: jax.Array) -> jax.Array:
    """A fake slow device: the computation itself sleeps, after dispatch has returned."""
    return io_callback(_sleep, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2.0) + 1.0


def test_every_sample_waits_for_the_device() -> None:
    r = run(slow_device, jnp.ones(4), samples=5, min_time=0.0, warmup=1)
    assert r.valid and r.loops == 1
    assert min(r.samples_s) >= SLEEP  # the sleep is inside every sample
    assert r.stats.median >= SLEEP


def test_the_whole_output_tree_is_awaited() -> None:
    def two(x: jax.Array) -> dict[str, Any]:
        return {"fast": x + 1, "slow": [slow_device(x)]}

    r = run(two, jnp.ones(3), samples=4, min_time=0.0)
    assert min(r.samples_s) >= SLEEP


def test_phases_apart_and_analyses_recorded() -> None:
    r = run(lambda x: jnp.tanh(x @ x.T), jnp.ones((16, 16)), samples=5, min_time=0.001)
    assert r.status == "ok" and r.reason == ""
    assert all(r.phases[k] is not None and r.phases[k] > 0 for k in r.phases)
    assert r.compiles["warmup"]["compile"] >= 1
    assert r.compiles["measure"] == {"trace": 0, "lower": 0, "compile": 0}
    assert r.memory is not None and {"argument", "output", "temp"} <= set(r.memory)
    assert r.cost is not None and r.cost["flops"] > 0 and r.flops_per_s is not None
    assert r.loops >= 1 and r.stats.n == 5
    assert r.conditions["backend"] == jax.default_backend()
    assert len(r.cpu_samples_s) == 5 and all(c >= 0 for c in r.cpu_samples_s)


def test_a_shape_change_inside_the_timed_window_is_invalid() -> None:
    inner = jax.jit(lambda x: x.sum())
    calls = {"n": 0}

    def growing() -> jax.Array:
        calls["n"] += 1  # a ragged input: each call after warm-up has a new length
        return inner(np.ones(calls["n"] if calls["n"] > 3 else 1, np.float32))

    r = run(growing, jit=False, samples=3, min_time=0.0, warmup=2)
    assert r.status == "invalid" and not r.valid
    assert r.compiles["measure"] == {"trace": 3, "lower": 3, "compile": 3}
    assert r.reason.startswith("3 trace(s), 3 lower(s), 3 compile(s) during the timed samples")
    assert "hint: keep shapes, dtypes and weak types of the arguments fixed" in r.reason


def test_a_steady_opaque_callable_is_valid_and_its_first_call_compiles() -> None:
    f = jax.jit(lambda x: x * 2)

    r = run(lambda: f(jnp.ones(7)), jit=False, samples=3, min_time=0.0)
    assert r.valid
    assert r.phases["first_call_s"] is not None


def test_an_already_jitted_function_is_used_as_it_is() -> None:
    f = jax.jit(lambda x: x + 1)
    r = run(f, jnp.ones(3), samples=3, min_time=0.0)
    assert r.valid and r.name == "<lambda>"


def test_calibration_stops_once_a_sample_lasts_min_time() -> None:
    # A fake clock that advances with each call: with ``jit=False`` the runner
    # calls the plain Python function as given, so the clock sees every call.
    clock = {"now": 0.0, "calls": 0}

    def two_ms() -> None:  # each call lasts exactly 2 ms
        clock["now"] += 0.002
        clock["calls"] += 1

    timer = Timer(wall=lambda: clock["now"], cpu=lambda: clock["now"])
    once = {"backend": "cpu"}  # the machine's conditions are not what is tested here
    r = run(two_ms, jit=False, samples=2, min_time=0.0, warmup=0, timer=timer, conditions=once)
    assert r.loops == 1
    assert clock["calls"] == 1 + 2  # the first call and the samples: none to calibrate
    clock["calls"] = 0
    r = run(two_ms, jit=False, samples=2, min_time=0.01, warmup=0, timer=timer, conditions=once)
    assert r.loops * 0.002 >= 0.01  # one sample of that many calls lasts min_time
    assert r.loops == 6  # 5 calls reach 10 ms exactly; the 5% margin asks one more
    assert clock["calls"] == 1 + (1 + 6) + 2 * 6  # first call, the two calibration rounds, samples
    assert r.samples_s == pytest.approx((0.002, 0.002))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples": 0}, "samples=0\nhint: pass an int >= 1 (30 is the default)"),
        ({"min_time": -1.0}, "min_time=-1.0\nhint: pass seconds >= 0 per sample"),
        ({"warmup": -1}, "warmup=-1\nhint: pass an int >= 0"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BenchError, match="^" + re.escape(message)):
        run(jnp.sin, jnp.ones(2), **kwargs)


def test_results_round_trip_through_a_file(tmp_path: Path) -> None:
    r = run(jnp.cos, jnp.ones(4), samples=4, min_time=0.0, meta={"batch": "x: f32[4]"})
    p = save_results(tmp_path / "r.json", [r, r])
    doc = json.loads(p.read_text())
    assert doc["format"] == "treeguard.bench/1" and len(doc["results"]) == 2
    assert (
        "conditions" not in doc["results"][0]
        and doc["conditions"]["backend"] == jax.default_backend()
    )
    back = load_results(p)
    assert back[0].samples_s == r.samples_s and back[0].conditions == doc["conditions"]
    assert back[0].stats == r.stats and back[0].meta == {"batch": "x: f32[4]"}
    assert back[0].cpu_samples_s == r.cpu_samples_s


def test_the_html_is_offline_and_shows_histogram_and_phases() -> None:
    r = run(jnp.cos, jnp.ones(4), samples=4, min_time=0.0)
    page = to_html([r], title="t")
    assert page.count("<svg") == 2 and "first call" in page and "Conditions" in page
    assert "<script" not in page and "src=" not in page and "href=" not in page


def _doc(tmp_path: Path) -> dict[str, Any]:
    r = run(jnp.cos, jnp.ones(4), samples=3, min_time=0.0)
    return json.loads(save_results(tmp_path / "ok.json", [r]).read_text())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: "not json", "the benchmark file is not valid JSON"),
        (lambda d: [1, 2], "a JSON list, not a benchmark document"),
        (lambda d: {**d, "format": "treeguard.bench/9"}, "is newer than 'treeguard.bench/1'"),
        (lambda d: {**d, "format": "other"}, "format 'other', expected 'treeguard.bench/1'"),
        (lambda d: {**d, "results": []}, "['results']: expected a non-empty list"),
        (
            lambda d: {**d, "results": [{**d["results"][0], "samples_s": []}]},
            "['results'][0]['samples_s']: expected a non-empty list of durations >= 0",
        ),
        (
            lambda d: {**d, "results": [{**d["results"][0], "samples_s": [1, "x"]}]},
            "['results'][0]['samples_s']: expected a non-empty list of durations >= 0",
        ),
        (
            lambda d: {**d, "results": [{**d["results"][0], "loops": True}]},
            "['results'][0]['loops']: a bool, expected int",
        ),
        (
            lambda d: {**d, "results": [{**d["results"][0], "status": "great"}]},
            "['results'][0]['status']: 'great', expected 'ok' or 'invalid'",
        ),
        (
            lambda d: {**d, "results": [{**d["results"][0], "memory": {"temp": "lots"}}]},
            "['results'][0]['memory']: expected numbers by name",
        ),
        (
            lambda d: {**d, "results": [{k: v for k, v in d["results"][0].items() if k != "name"}]},
            "['results'][0]: no 'name'",
        ),
    ],
)
def test_hostile_files_are_refused(tmp_path: Path, edit: Any, message: str) -> None:
    doc = edit(_doc(tmp_path))
    p = tmp_path / "bad.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(FormatError) as e:
        load_results(p)
    assert message in str(e.value)


def test_nan_deep_nesting_and_non_files_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "nan.json"
    p.write_text('{"format": "treeguard.bench/1", "x": NaN}')
    with pytest.raises(FormatError, match="the benchmark file: NaN is not a JSON number"):
        load_results(p)
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError, match="the benchmark file: it nests deeper than 512"):
        load_results(p)
    with pytest.raises(FormatError, match="not a regular file"):
        load_results(tmp_path)
