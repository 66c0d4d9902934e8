"""treeguard's pytest plugin: golden-file regression tests for pytrees.

The fixture ``tree_regression`` compares a tree with a golden file stored
next to the test, in treeguard's checkpoint format (safetensors with a
manifest, so bf16 and the other ml_dtypes work), at tolerances the test
states explicitly. Every leaf beyond tolerance is reported by key path,
and a changed structure is reported mismatch by mismatch. A missing golden
file fails the test; ``pytest --treeguard-update`` (re)records the golden
files instead of comparing, so nothing is ever recorded silently.

Example test::

    def test_init(tree_regression):
        params = init(jax.random.key(0))
        tree_regression.check(params, rtol=1e-6, atol=1e-6)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._src.tolerance import TolerancePolicy

UPDATE_OPTION = "--treeguard-update"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Adds ``--treeguard-update``."""
    group = parser.getgroup("treeguard")
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="re-record the golden files of tree_regression instead of comparing with them",
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "tree"


class TreeRegression:
    """Compares trees with golden files; the object behind the ``tree_regression`` fixture.

    Attributes:
      directory: where the golden files of this test live
        (``<test dir>/<test module>/`` by default); may be reassigned.
      update: whether this run records instead of comparing.
    """

    def __init__(self, directory: Path, test_name: str, update: bool) -> None:
        self.directory = directory
        self.test_name = _slug(test_name)
        self.update = update
        self._used: set[str] = set()

    def path_for(self, name: str | None = None) -> Path:
        """The golden file for ``name`` (the test's own file when None)."""
        stem = self.test_name if name is None else f"{self.test_name}-{_slug(name)}"
        return self.directory / f"{stem}.safetensors"

    def check(
        self,
        tree: Any,
        /,
        *,
        rtol: float,
        atol: float,
        tolerances: Mapping[str, tuple[float, float]] | None = None,
        name: str | None = None,
    ) -> None:
        """Compares ``tree`` with its golden file, or records it under ``--treeguard-update``.

        Args:
          tree: any pytree of arrays (bf16 included).
          rtol: the relative tolerance, stated explicitly.
          atol: the absolute tolerance, stated explicitly.
          tolerances: per-dtype ``(rtol, atol)``, by dtype name
            (``{"bfloat16": (1e-2, 1e-2)}``).
          name: distinguishes several golden files in one test.

        Raises:
          pytest.fail.Exception: listing every leaf beyond tolerance by path,
            or every structural mismatch, or naming the missing golden file.
        """
        # Deferred: pytest loads this plugin in every session, and only a test
        # that asks for the fixture should pay for treeguard's arrays and files.
        from ._src.tolerance import Tolerance, TolerancePolicy

        path = self.path_for(name)
        if str(path) in self._used:
            pytest.fail(
                f"tree_regression: golden file {path.name} checked twice in one test; "
                "hint: pass name=... to tell the trees apart",
                pytrace=False,
            )
        self._used.add(str(path))
        policy = TolerancePolicy(
            default=Tolerance(rtol, atol),
            dtypes={k: Tolerance(*v) for k, v in (tolerances or {}).items()},
        )
        if self.update:
            _record(path, tree, policy, rtol=rtol, atol=atol)
        else:
            _compare(path, tree, policy)


def _record(path: Path, tree: Any, policy: TolerancePolicy, *, rtol: float, atol: float) -> None:
    """Writes ``tree`` as the golden file, with the tolerances it is held to."""
    from ._src import checkpoint  # deferred, as in ``check``
    from ._src.leaf import resolve_dtype, short_dtype

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "rtol": rtol,
        "atol": atol,
        "tolerances": {
            short_dtype(resolve_dtype(k)): [v.rtol, v.atol] for k, v in policy.dtypes.items()
        },
    }
    checkpoint.save(path, tree, metadata={"treeguard.golden": meta})


def _compare(path: Path, tree: Any, policy: TolerancePolicy) -> None:
    """Fails the test unless ``tree`` matches the golden file within ``policy``."""
    from ._src import checkpoint  # deferred, as in ``check``
    from ._src.mismatch import format_mismatches
    from ._src.verify.compare import compare_stored

    if not path.exists():
        pytest.fail(
            f"tree_regression: no golden file {path}; hint: record it with "
            f"`pytest {UPDATE_OPTION}` and commit it",
            pytrace=False,
        )
    # Read back without `like`, compared with the file's spec (weak types
    # ignored, as every checkpoint contract ignores them) and leaf by leaf.
    golden = checkpoint.load(path)
    changed, errors = compare_stored(
        tree, golden, spec=checkpoint.read_header(path).spec, tolerance=policy
    )
    if changed:
        text = format_mismatches(changed, expected_from="the golden file", actual_from="the tree")
        pytest.fail(
            f"tree_regression: the tree's structure differs from {path.name}:\n{text}\n"
            f"hint: if the change is intended, re-record with `pytest {UPDATE_OPTION}`",
            pytrace=False,
        )
    bad = [e for e in errors if not e.ok]
    if bad:
        pytest.fail(
            f"tree_regression: {len(bad)} of {len(errors)} leaves beyond tolerance "
            f"against {path.name}:\n  " + "\n  ".join(e.describe() for e in bad) + "\n"
            f"hint: if the change is intended, re-record with `pytest {UPDATE_OPTION}`",
            pytrace=False,
        )


@pytest.fixture
def tree_regression(request: pytest.FixtureRequest) -> TreeRegression:
    """Compares a pytree with a golden file next to the test, at explicit tolerances.

    ``tree_regression.check(tree, rtol=..., atol=...)`` fails listing every
    leaf beyond tolerance by key path; ``pytest --treeguard-update``
    re-records the golden files.
    """
    test_file = Path(str(request.node.path))
    directory = test_file.parent / test_file.stem
    update = bool(request.config.getoption(UPDATE_OPTION, default=False))
    return TreeRegression(directory, request.node.name, update)
