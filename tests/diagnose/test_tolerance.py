"""TolerancePolicy: path globs over dtypes over the default, and the fp64 rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from treeguard import ConfigError

# The fp64 rule alone, on purpose: a property over random values, where a locate
# call per example would compile a program each time.
from treeguard._src.diagnose.tolerance import fp64_passes  # _src: fp64 rule as a property
from treeguard.diagnose import TolerancePolicy
from treeguard.verify import Tolerance


def test_rules_apply_path_then_dtype_then_default() -> None:
    t = TolerancePolicy(
        default=Tolerance(1e-5, 1e-6),
        dtypes={"bf16": Tolerance(1e-2, 1e-2)},
        paths=[("*['head']*", Tolerance(0.0, 1.0))],
    )
    assert t.for_leaf("['head']['w']", "bfloat16") == Tolerance(0.0, 1.0)
    assert t.for_leaf("['body']['w']", "bfloat16") == Tolerance(1e-2, 1e-2)
    assert t.for_leaf("['body']['w']", "float32") == Tolerance(1e-5, 1e-6)
    assert t.for_leaf("['step']", "int32") == Tolerance(0.0, 0.0)
    assert TolerancePolicy().for_leaf("", "float16") == Tolerance(1e-3, 1e-5)  # float16's default


def test_malformed_rules_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"hint: \(glob, Tolerance\(rtol, atol\)\)"):
        TolerancePolicy(paths=[("*", 1e-3)])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="hint: a multiplier >= 1"):
        TolerancePolicy(fp64=0.5)


@given(
    st.lists(st.floats(-100, 100), min_size=1, max_size=16),
    st.floats(1e-6, 1e-2),
    st.floats(1.5, 4.0),
)
def test_fp64_rule_passes_a_candidate_no_worse_than_the_reference(
    values: list[float], noise: float, m: float
) -> None:
    exact = np.asarray(values, np.float64)
    ref = exact + noise
    assert fp64_passes(ref, ref, exact, Tolerance(0.0, 0.0), m)  # as good as the reference
    assert fp64_passes(exact - noise, ref, exact, Tolerance(0.0, 0.0), m)
    assert not fp64_passes(exact + 10 * m * noise, ref, exact, Tolerance(0.0, 0.0), m)
