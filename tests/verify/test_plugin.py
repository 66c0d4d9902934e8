"""The pytest plugin: the ``tree_regression`` fixture and ``--treeguard-update``,
exercised through pytest's own ``pytester``, in process."""

from __future__ import annotations

from importlib.metadata import entry_points

import jax
import pytest
from machine import cpu_devices

from treeguard.examples import mlp

PLUGIN = "treeguard.pytest_plugin"
_ARGS = [] if any(ep.value == PLUGIN for ep in entry_points(group="pytest11")) else ["-p", PLUGIN]

TEST = """
import jax.numpy as jnp
import numpy as np

SCALE = {scale}
H_SCALE = {hscale}

def test_params(tree_regression):
    tree = {{"dense1": {{"w": jnp.arange(6.0).reshape(2, 3) * SCALE, "b": jnp.zeros(3)}},
             "h": jnp.ones(4, jnp.bfloat16) * H_SCALE}}
    tree_regression.check(tree, rtol=1e-6, atol=1e-6, tolerances={{"bf16": (1e-2, 0.0)}})
"""


class Result:
    """What an in-process pytest run printed, and its outcome counts."""

    def __init__(self, run: pytest.RunResult) -> None:
        self.run = run
        self.ret = run.ret
        self.out = run.stdout.str() + "\n" + run.stderr.str()

    def assert_outcomes(self, *, passed: int = 0, failed: int = 0) -> None:
        self.run.assert_outcomes(passed=passed, failed=failed)


def _run(pytester: pytest.Pytester, *args: str) -> Result:
    return Result(pytester.runpytest(*_ARGS, "-q", "-p", "no:cacheprovider", *args))


def test_missing_golden_fails_then_update_records_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_golden=TEST.format(scale=1.0, hscale=1.0))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "tree_regression: no golden file " in result.out
    assert (
        "test_golden/test_params.safetensors; hint: record it with `pytest --treeguard-update` "
        "and commit it"
    ) in " ".join(result.out.split())
    _run(pytester, "--treeguard-update").assert_outcomes(passed=1)
    assert (pytester.path / "test_golden" / "test_params.safetensors").exists()
    _run(pytester).assert_outcomes(passed=1)


def test_every_leaf_beyond_tolerance_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_golden=TEST.format(scale=1.0, hscale=1.0))
    _run(pytester, "--treeguard-update").assert_outcomes(passed=1)
    pytester.makepyfile(test_golden=TEST.format(scale=1.1, hscale=1.1))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    out = result.out
    assert (
        "tree_regression: 2 of 3 leaves beyond tolerance against test_params.safetensors:\n"
        "  ['dense1']['w'] f32[2,3]: 5 of 6 elements beyond tolerance, max abs err 0.5, "
        "max rel err 0.1 (rtol 1e-06, atol 1e-06)\n"
        "  ['h'] bf16[4]: 4 of 4 elements beyond tolerance, max abs err 0.102, "
        "max rel err 0.102 (rtol 0.01, atol 0)\n"
        "hint: if the change is intended, re-record with `pytest --treeguard-update`"
    ) in out
    assert "['dense1']['b']" not in out


def test_bf16_within_its_own_tolerance_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_golden=TEST.format(scale=1.0, hscale=1.0))
    _run(pytester, "--treeguard-update").assert_outcomes(passed=1)
    # One bf16 step above 1.0 is 0.8% off: within bf16's rtol 1e-2, far beyond the default.
    pytester.makepyfile(test_golden=TEST.format(scale=1.0, hscale=1.0078125))
    _run(pytester).assert_outcomes(passed=1)
    pytester.makepyfile(test_golden=TEST.format(scale=1.0, hscale=1.03125))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "  ['h'] bf16[4]: 4 of 4 elements beyond tolerance" in result.out


def test_changed_structure_is_reported_by_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_golden=TEST.format(scale=1.0, hscale=1.0))
    _run(pytester, "--treeguard-update").assert_outcomes(passed=1)
    pytester.makepyfile(
        test_golden="""
import jax.numpy as jnp

def test_params(tree_regression):
    tree = {"dense_1": {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}, "h": jnp.ones(4, jnp.bfloat16)}
    tree_regression.check(tree, rtol=1e-6, atol=1e-6)
"""
    )
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    out = result.out
    assert "tree_regression: the tree's structure differs from test_params.safetensors:\n" in out
    assert "  ['dense1']: missing: dict of 2 leaves (f32[3], f32[2,3]) in the golden file" in out
    assert "  ['dense_1']: unexpected: dict of 2 leaves" in out
    assert "did you mean `['dense1']`?" in out


WEAK = """
import jax.numpy as jnp

def test_scale(tree_regression):
    tree = {{"w": jnp.ones(3), "scale": {scale}}}
    tree_regression.check(tree, rtol=0, atol=0)
"""


def test_weak_types_are_ignored_as_checkpoint_contracts_ignore_them(
    pytester: pytest.Pytester,
) -> None:
    # Recorded from a weakly typed scalar (a Python float under jnp.asarray) ...
    pytester.makepyfile(test_weak=WEAK.format(scale="jnp.asarray(2.0)"))
    _run(pytester, "--treeguard-update").assert_outcomes(passed=1)
    # ... and compared with a strongly typed one of the same value and dtype.
    pytester.makepyfile(test_weak=WEAK.format(scale="jnp.asarray(2.0, jnp.float32)"))
    _run(pytester).assert_outcomes(passed=1)
    pytester.makepyfile(test_weak=WEAK.format(scale="jnp.asarray(2.5, jnp.float32)"))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "tree_regression: 1 of 2 leaves beyond tolerance against test_scale.safetensors:\n" in (
        result.out
    )
    assert "  ['scale'] f32[]: 1 of 1 elements beyond tolerance, max abs err 0.5" in result.out


def test_two_trees_in_one_test_need_names(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_two="""
import numpy as np

def test_two(tree_regression):
    tree_regression.check({"a": np.ones(2)}, rtol=0, atol=0, name="first")
    tree_regression.check({"a": np.ones(3)}, rtol=0, atol=0, name="second")
    tree_regression.check({"a": np.ones(3)}, rtol=0, atol=0, name="second")
"""
    )
    result = _run(pytester, "--treeguard-update")
    result.assert_outcomes(failed=1)
    assert "golden file test_two-second.safetensors checked twice in one test" in result.out


def test_the_example_params_against_the_shipped_golden(tree_regression) -> None:  # type: ignore[no-untyped-def]
    # the golden was drawn on the CPU; a TPU draws normals about 1e-5 apart
    with jax.default_device(cpu_devices(1)[0]):
        tree_regression.check(mlp.init(jax.random.key(0)), rtol=1e-6, atol=1e-7)
