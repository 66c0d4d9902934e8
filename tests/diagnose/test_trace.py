"""Recorded traces: record here, compare there, equation by equation."""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests.subproc import run_module
from treeguard import save
from treeguard.diagnose import DiagnosisError, Trace, locate, record_trace


def step(p: dict[str, jax.Array], x: jax.Array, scale: float = 1.0) -> dict[str, jax.Array]:
    h = jnp.tanh(x @ p["w"])
    h = h * scale
    return {"loss": jnp.sum(h**2), "h": h}


P = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)}
XS = jnp.linspace(0.0, 1.0, 6).reshape(2, 3)


def test_a_trace_round_trips_and_matches_itself(tmp_path: Path) -> None:
    path = record_trace(tmp_path / "t.safetensors", jax.jit(step), P, XS, label="step")
    trace = Trace.load(path)
    assert [p for p, _ in trace.equations.values()] == [
        "dot_general",
        "tanh",
        "mul",
        "integer_pow",
        "reduce_sum",
    ]
    assert trace.output_paths == ["['h']", "['loss']"]
    d = locate(jax.jit(step), P, XS, candidate=trace)
    assert (d.outcome, d.exit_code, d.environment) == ("none", 0, ())


def test_a_changed_equation_is_the_culprit_and_what_follows_propagates(tmp_path: Path) -> None:
    path = record_trace(tmp_path / "t.safetensors", step, P, XS)
    d = locate(lambda p, x: step(p, x, scale=1.001), P, XS, candidate=Trace.load(path))
    assert d.outcome == "located" and d.exit_code == 1
    assert d.equation is not None
    line = inspect.getsourcelines(step)[1] + 2
    assert (d.equation.index, d.equation.primitive, d.equation.role) == ("2", "mul", "culprit")
    assert d.equation.source == f"test_trace.py:{line} (step)"
    assert [(s.primitive, s.role) for s in d.propagators] == [
        ("integer_pow", "propagator"),
        ("reduce_sum", "propagator"),
    ]


def test_a_checkpoint_that_is_no_trace_is_refused(tmp_path: Path) -> None:
    save(tmp_path / "params.safetensors", P)
    with pytest.raises(DiagnosisError) as e:
        Trace.load(tmp_path / "params.safetensors")
    assert str(e.value).endswith(
        "is a checkpoint but not a recorded trace (format None, expected "
        "'treeguard.diagnose-trace/1')\nhint: record one with "
        "`treeguard diagnose MODULE:ATTR --record PATH`"
    )


_MODEL = '''
    """A model whose dense layer rounds its product when the matmul precision
    is bfloat16, as accelerators do (XLA's CPU backend ignores the setting)."""
    import jax, jax.numpy as jnp
    from treeguard import LeafSpec, spec_of
    from treeguard.verify import Model

    def init(key):
        return {"w": jax.random.normal(key, (2, 3)), "v": jax.random.normal(key, (3, 1))}

    def dense(x, w):
        bf16 = str(jax.config.jax_default_matmul_precision) == "bfloat16"
        return jax.lax.reduce_precision(x @ w, exponent_bits=8, mantissa_bits=7 if bf16 else 23)

    def apply(p, b):
        return dense(jnp.tanh(dense(b["x"], p["w"])), p["v"])

    def loss(p, b):
        return jnp.mean((apply(p, b) - b["y"]) ** 2)

    model = Model(init=init, apply=apply, loss=loss, rtol=1e-5, atol=1e-6, name="toy",
                  batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32"),
                                      "y": LeafSpec(("B", 1), "float32")}))
'''


@pytest.mark.slow
def test_a_trace_recorded_in_one_process_locates_the_difference_in_another(
    tmp_path: Path,
) -> None:
    (tmp_path / "toy_model.py").write_text(textwrap.dedent(_MODEL))
    trace = tmp_path / "trace.safetensors"
    env = {"PYTHONPATH": str(tmp_path)}
    rec = run_module(
        "treeguard",
        [
            "diagnose",
            "toy_model:model",
            "--stages",
            "data,shapes",
            "--record",
            str(trace),
            "--report-dir",
            str(tmp_path / "a"),
        ],
        env=env,
        cwd=tmp_path,
    )
    assert rec.returncode == 0, rec.stdout + rec.stderr
    other = {
        **env,
        "JAX_DEFAULT_MATMUL_PRECISION": "bfloat16",
        "XLA_FLAGS": "--xla_cpu_enable_fast_math=false",
    }
    cmp = run_module(
        "treeguard",
        [
            "diagnose",
            "toy_model:model",
            "--against",
            str(trace),
            "--report-dir",
            str(tmp_path / "b"),
        ],
        env=other,
        cwd=tmp_path,
    )
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    doc = json.loads((tmp_path / "b" / "diagnosis.json").read_text())
    stage = doc["stages"][0]
    assert stage["name"] == "trace" and stage["status"] == "fail"
    div = stage["divergence"]
    assert {e["key"] for e in div["environment"]} >= {
        "matmul_precision",
        "XLA_FLAGS",
        "JAX_DEFAULT_MATMUL_PRECISION",
    }
    assert (div["equation"]["primitive"], div["equation"]["role"]) == (
        "reduce_precision",
        "culprit",
    )
    lines = textwrap.dedent(_MODEL).splitlines()
    line = next(i for i, t in enumerate(lines, 1) if "reduce_precision(" in t)
    assert div["equation"]["source"] == f"toy_model.py:{line} (dense)"
    assert not any("the program differs" in n for n in div["notes"])
    assert "environment: matmul_precision was None when recorded, is 'bfloat16' here" in cmp.stdout
