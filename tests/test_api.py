"""The public surface: __all__ is exact, names resolve lazily, and import stays light."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest
from subproc import run_python

import treeguard


def _public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def test_all_matches_the_exports() -> None:
    assert sorted(treeguard.__all__) == treeguard.__all__
    for name in treeguard.__all__:  # a lazy name is in vars() once resolved
        getattr(treeguard, name)
    assert set(treeguard.__all__) == _public_names(treeguard)
    assert set(treeguard.__all__) <= set(dir(treeguard))


def test_a_lazy_name_is_the_defining_module_object() -> None:
    exports = treeguard._EXPORTS
    assert set(exports) == set(treeguard.__all__)
    for name, module in exports.items():
        defining = importlib.import_module(module, "treeguard")
        assert getattr(treeguard, name) is getattr(defining, name), name
    from treeguard import TreeSpec, spec_of

    assert TreeSpec is treeguard.TreeSpec and spec_of is treeguard.spec_of


def _type_checking_imports() -> dict[str, str]:
    """What the type checkers see: ``name -> module`` from the TYPE_CHECKING block."""
    tree = ast.parse(Path(treeguard.__file__).read_text(encoding="utf-8"))
    block = next(
        n
        for n in tree.body
        if isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING")
    )
    seen: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name} is imported as {alias.asname}"
            assert alias.name not in seen, f"{alias.name} is imported twice"
            seen[alias.name] = "." * node.level + (node.module or "")
    return seen


def test_the_lazy_table_is_the_one_list_of_public_names() -> None:
    assert treeguard.__all__ == sorted(treeguard._EXPORTS)
    assert _type_checking_imports() == treeguard._EXPORTS


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'spec'"):
        treeguard.spec  # noqa: B018 - the access is the test
    with pytest.raises(ImportError):
        from treeguard import no_such_name  # noqa: F401


def test_every_public_name_has_a_docstring() -> None:
    for name in treeguard.__all__:
        assert getattr(treeguard, name).__doc__, name


def test_import_pulls_in_neither_jax_nor_numpy_nor_optional_modules() -> None:
    heavy = [
        "jax",
        "jaxlib",
        "ml_dtypes",
        "numpy",
        "flax",
        "equinox",
        "optax",
        "orbax",
        "tensorstore",
        "click",
        "rich",
        "matplotlib",
        "starlette",
        "uvicorn",
        "prometheus_client",
        "scipy",
    ]
    code = (
        "import sys, treeguard\n"
        f"heavy = set({heavy!r})\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
