"""The checkpoint reader's plan, told to a bucket: a partial load from a
real SeaweedFS S3 server fetches the header once and then exactly the
spans the reader announced, nothing else of the object."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from obstore.store import S3Store

from tests.s3server import CuttingProxy, S3Server
from treeguard import ArtifactStore, read_header

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

#: The first bytes of an object come with its size in the reader's first request.
HEAD = 1 << 16


def _object(url: str, version: str, tmp_path: Path) -> Path:
    """The version's checkpoint object, copied beside the test by a client
    that bypasses the store."""
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    raw = S3Store(bucket, prefix=prefix)
    local = tmp_path / "v.safetensors"
    local.write_bytes(bytes(obstore.get(raw, f"versions/{version}/model.safetensors").bytes()))
    return local


def _ranges(
    server: S3Server, monkeypatch: pytest.MonkeyPatch, load: Any
) -> tuple[Any, list[tuple[int, int]]]:
    """What ``load`` returns and every ranged request the client sent."""
    with CuttingProxy(server.endpoint, after=1 << 40, cuts=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        got = load()
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    return got, proxy.ranges


def test_a_partial_load_reads_its_header_once_then_only_the_planned_spans(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # enough leaves that the header runs past the first request's bytes
    tree = {
        "big": {f"k{i:04d}": np.full(4, i, np.float32) for i in range(1500)},
        "part": {"w": np.arange(1 << 16, dtype=np.float32), "b": np.ones(7, np.float32)},
    }
    v = ArtifactStore.init(s3_url).put(tree)
    header = read_header(_object(s3_url, v, tmp_path))
    end = header.data_start  # the header ends where the data starts
    assert end > HEAD
    chosen = [t for t in header.tensors if t.name.startswith("['part']")]
    first = min(header.data_start + t.begin for t in chosen)
    last = max(header.data_start + t.end for t in chosen)
    assert sum(t.nbytes for t in chosen) == last - first  # the part lies in one run

    got, ranges = _ranges(
        s3_server,
        monkeypatch,
        lambda: ArtifactStore(s3_url).load_version(v, tree["part"], subtree="['part']"),
    )
    assert np.array_equal(got["w"], tree["part"]["w"]) and np.array_equal(
        got["b"], tree["part"]["b"]
    )
    # one request for the first bytes, one for the rest of the header, one for
    # the selected part: the header is fetched (and parsed) once, nothing unplanned
    assert ranges == [(0, HEAD), (HEAD, end), (first, last)]


def test_a_whole_load_from_a_bucket_fetches_the_data_in_one_request(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tree = {name: np.full(1 << 16, i, np.float32) for i, name in enumerate("abc")}
    v = ArtifactStore.init(s3_url).put(tree)
    header = read_header(_object(s3_url, v, tmp_path))
    got, ranges = _ranges(s3_server, monkeypatch, lambda: ArtifactStore(s3_url).load_version(v))
    assert all(np.array_equal(got[k], tree[k]) for k in tree)
    size = header.data_start + max(t.end for t in header.tensors)
    assert ranges == [(0, HEAD), (HEAD, size)]
