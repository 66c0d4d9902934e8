"""The ``xdist_group`` marks hold: under ``--dist loadgroup`` every test of a
group carries ``@GROUP`` in its node id, the suffix by which xdist's
controller sends the whole group to one worker (the session's SeaweedFS
server, the Ray clusters and each docs page's blocks rely on it; the root
conftest.py appends it where pytest-xdist could not)."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("groupcheck")
def test_a_grouped_test_carries_its_group_in_its_node_id(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by an xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@groupcheck"), request.node.nodeid
