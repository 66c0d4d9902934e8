"""The public surface: __all__ is exact, and import stays light."""

from __future__ import annotations

import subprocess
import sys
import types

import treeguard


def _public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def test_all_matches_the_exports() -> None:
    assert sorted(treeguard.__all__) == treeguard.__all__
    assert set(treeguard.__all__) == _public_names(treeguard)


def test_every_public_name_has_a_docstring() -> None:
    for name in treeguard.__all__:
        assert getattr(treeguard, name).__doc__, name


def test_import_pulls_in_no_heavy_optional_modules() -> None:
    code = (
        "import sys, treeguard\n"
        "heavy = {'flax', 'equinox', 'optax', 'orbax', 'tensorstore', 'click', 'rich', 'matplotlib'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
