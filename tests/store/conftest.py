"""Fixtures of the store tests: a bucket store seen through a lying proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3server import LyingProxy, S3Server
from tests.store.liars import Liar
from treeguard import ArtifactStore


@pytest.fixture
def liar() -> Liar:
    return Liar()


@pytest.fixture
def lying(
    s3_url: str, s3_server: S3Server, liar: Liar, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ArtifactStore, ArtifactStore]]:
    """The store through the lying proxy, and the same store seen honestly."""
    honest = ArtifactStore.init(s3_url)
    with LyingProxy(s3_server.endpoint, liar) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield ArtifactStore(s3_url), honest
