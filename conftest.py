"""What the doctests under ``treeguard/`` need of the machine, and the
``xdist_group`` marks made to hold under pytest 9.2.

The TPU machine lets no process open an internet socket, not even on the
loopback; the doctests that pick a free port there are skipped, saying why.

``--dist loadgroup`` (pyproject.toml's addopts) sends every test of one
``xdist_group`` to one worker by appending ``@GROUP`` to its node id; since
pytest 9.2 keeps the id as a structured ``NodeId``, pytest-xdist 3.8's write
to the old ``_nodeid`` field has no effect and the groups are silently split
(pytest-dev/pytest-xdist#1386): two SeaweedFS servers, two Ray clusters, and
every module-scoped cluster made once per worker. ``pytest_collection_modifyitems``
below appends the suffix where xdist's did not take.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem, DoctestModule

try:  # pytest >= 9.2: a node's id is structured (older pytest: xdist's own suffix holds)
    from _pytest.nodeid import NodeId
except ImportError:  # pragma: no cover - pytest < 9.2
    NodeId = None

sys.path.insert(0, str(Path(__file__).parent / "tests"))

from machine import inet_sockets

#: The doctests that open an internet socket (to find a free port).
NEEDS_INET = frozenset({"treeguard._src.serving.ray.api.haproxy_environment"})


def skip_inet_doctests(items: list[pytest.Item]) -> None:
    """Skips the doctests of ``NEEDS_INET`` where no internet socket opens."""
    if inet_sockets():
        return
    why = pytest.mark.skip(reason="this machine opens no internet socket, not even on the loopback")
    for item in items:
        if item.name in NEEDS_INET:
            item.add_marker(why)


def xdist_group(item: pytest.Item) -> str | None:
    """The group of ``item``'s ``xdist_group`` marks as pytest-xdist names it, or None."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


def group_for_xdist(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under ``--dist loadgroup``, appends ``@GROUP`` to
    the node id of each grouped test whose id xdist could not change (see
    the module's docstring): the controller schedules by that suffix."""
    if not getattr(config.option, "loadgroup", False) or NodeId is None:
        return
    for item in items:
        group = xdist_group(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):
            item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture(autouse=True)
def _doctest_temps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A doctest's ``tempfile.mkdtemp()`` (the examples make their files
    there) is made in the test's ``tmp_path``, which pytest removes: each
    run left 56 folders in ``/tmp`` before, on a disk CI shares."""
    if isinstance(request.node, DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A ``conftest.py`` is collected as no module: it holds no doctest, and
    under ``--doctest-modules`` pytest 9.2 imports each as the module
    ``conftest``, so a run of two test folders with their own (``pytest
    tests/store tests/sharded``) failed to collect the second ("import file
    mismatch"). Its fixtures and hooks load as before."""
    return True if collection_path.name == "conftest.py" else None


#: The folder of the test files, which hold no doctest.
TESTS = Path(__file__).parent / "tests"


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(
    file_path: Path,
) -> Generator[None, list[pytest.Collector], list[pytest.Collector]]:
    """A test file under ``tests/`` is collected as its tests alone, not also
    as a module of doctests (it has none): under ``--doctest-modules``
    pytest registered each of its fixtures twice, once for each collector,
    and ``pytest --fixtures tests/store`` stopped on sorting the two
    ("'<' not supported between instances of 'FixtureDef'")."""
    found = yield
    if not file_path.is_relative_to(TESTS):
        return found
    return [c for c in found if not isinstance(c, DoctestModule)]


@pytest.hookimpl(trylast=True)  # after xdist's own suffixing, which it checks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_inet_doctests(items)
    group_for_xdist(config, items)
