"""What the doctests under ``treeguard/`` need of the machine.

The TPU machine lets no process open an internet socket, not even on the
loopback; the doctests that pick a free port there are skipped, saying why.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))

from machine import inet_sockets

#: The doctests that open an internet socket (to find a free port).
NEEDS_INET = frozenset({"treeguard._src.serving.ray.api.haproxy_environment"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skips the doctests of ``NEEDS_INET`` where no internet socket opens."""
    if inet_sockets():
        return
    why = pytest.mark.skip(reason="this machine opens no internet socket, not even on the loopback")
    for item in items:
        if item.name in NEEDS_INET:
            item.add_marker(why)
