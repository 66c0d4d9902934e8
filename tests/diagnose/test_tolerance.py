"""TolerancePolicy: path globs over dtypes over the default (the fp64 rule is shown
accepting and refusing in test_locate.py)."""

from __future__ import annotations

import pytest

from treeguard import ConfigError
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
