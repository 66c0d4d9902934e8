"""The ``treeguard.diagnose`` namespace: ``__all__`` is exact and documented."""

from __future__ import annotations

import types

import treeguard.diagnose as diagnose


def test_all_matches_the_exports_and_each_has_a_docstring() -> None:
    public = {
        n
        for n, v in vars(diagnose).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert sorted(diagnose.__all__) == diagnose.__all__
    assert set(diagnose.__all__) == public
    for name in diagnose.__all__:
        value = getattr(diagnose, name)
        if not isinstance(value, tuple):
            assert value.__doc__, name
