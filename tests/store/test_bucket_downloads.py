"""A store's downloads from a bucket when the network breaks, stalls or lies:
each load resumes where it stopped, or fails typed, naming the object, and
leaves no download thread behind. Against a real SeaweedFS S3 server behind
a proxy that cuts, stalls or rewrites its answers."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import obstore
import pytest

from tests.s3server import CuttingProxy, S3Server
from tests.store.buckets import raw_store
from treeguard import ArtifactStore, IntegrityError, StorageError

# Every test here talks to the session's SeaweedFS server: the slow run starts
# it, on the one worker that runs the group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "treeguard-fetch"]


def _big_promoted(s3_url: str) -> tuple[ArtifactStore, str, dict[str, Any]]:
    """A store whose current version is 12 MiB: three streamed chunks."""
    tree = {"w": np.arange(3 << 20, dtype=np.float32)}
    store = ArtifactStore.init(s3_url)
    v = store.put(tree)
    store.verify(v)
    store.promote(v)
    return store, v, tree


def _fails_through(
    proxy: CuttingProxy,
    s3_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tree: Any,
    error: type[Exception],
    match: str,
) -> Exception:
    """Loads the current version through ``proxy``: it must fail with
    ``error`` and leave no download thread behind."""
    with proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(error, match=match) as e:
            ArtifactStore(s3_url).load_current(tree)
    assert not _fetch_threads()
    return e.value


def test_a_download_the_network_breaks_resumes_where_it_stopped(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, v, tree = _big_promoted(s3_url)
    size = obstore.head(raw_store(s3_url), f"versions/{v}/model.safetensors")["size"]
    with CuttingProxy(s3_server.endpoint, after=5 << 20, cuts=2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        got = ArtifactStore(s3_url).load_current(tree)
    assert np.array_equal(got["w"], tree["w"])
    assert proxy.cut == 2
    # the data's GET, then one GET per break, each from where the last one stopped
    starts = [start for start, stop in proxy.ranges if stop == size]
    assert len(starts) == 3 and starts == sorted(set(starts)) and starts[0] > 0
    assert not _fetch_threads()


def test_a_download_broken_again_and_again_is_a_storage_error_naming_the_object(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, tree = _big_promoted(s3_url)
    proxy = CuttingProxy(s3_server.endpoint, after=1 << 20, cuts=100)
    why = (
        r"reading versions/v000001/model\.safetensors failed: the connection broke during the "
        "answer"
    )
    _fails_through(proxy, s3_url, monkeypatch, tree, StorageError, why)
    assert proxy.cut == 3  # three tries, then no more
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert np.array_equal(store.load_current(tree)["w"], tree["w"])  # nothing was changed


def test_a_download_the_server_stalls_times_out_and_resumes(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_TIMEOUT", "2s")  # the client's limit on one request, answer included
    _, _, tree = _big_promoted(s3_url)
    with CuttingProxy(s3_server.endpoint, after=5 << 20, cuts=2, stall=True) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        got = ArtifactStore(s3_url).load_current(tree)
    assert np.array_equal(got["w"], tree["w"])
    assert proxy.cut == 2
    starts = [start for start, _ in proxy.ranges if start > 0]
    assert len(starts) >= 3 and starts == sorted(set(starts))
    assert not _fetch_threads()
    # a server that never answers again: three tries, each ended by the timeout
    proxy = CuttingProxy(s3_server.endpoint, after=1 << 20, cuts=100, stall=True)
    why = r"reading versions/v000001/model\.safetensors failed: it timed out"
    _fails_through(proxy, s3_url, monkeypatch, tree, StorageError, why)
    assert proxy.cut == 3


def _data_range(rewrite: Callable[[int, int], bytes]) -> Callable[[bytes], bytes]:
    """Rewrites the Range header of every request past the first bytes."""
    return lambda request: re.sub(
        rb"(?i)range: bytes=([1-9]\d*)-(\d+)\r\n",
        lambda m: rewrite(int(m.group(1)), int(m.group(2))),
        request,
    )


@pytest.mark.parametrize(
    "rewrite",
    [
        _data_range(lambda start, end: b""),  # the whole object, 200 instead of 206
        _data_range(lambda start, end: b"range: bytes=%d-%d\r\n" % (start + 1, end)),
        _data_range(lambda start, end: b"range: bytes=%d-%d\r\n" % (start, end - 1)),
    ],
    ids=["no-range", "one-byte-later", "one-byte-short"],
)
def test_a_server_that_answers_other_bytes_than_the_range_is_a_storage_error(
    s3_server: S3Server,
    s3_url: str,
    monkeypatch: pytest.MonkeyPatch,
    rewrite: Callable[[bytes], bytes],
) -> None:
    _, _, tree = _big_promoted(s3_url)
    proxy = CuttingProxy(s3_server.endpoint, after=1 << 40, cuts=0, rewrite=rewrite)
    why = (
        r"reading versions/v000001/model\.safetensors failed: the server did not answer with "
        "the byte range asked for"
    )
    _fails_through(proxy, s3_url, monkeypatch, tree, StorageError, why)
    assert len(proxy.ranges) > 1  # the first bytes, then the data's ranged GETs it rewrote


def test_a_416_for_the_first_bytes_of_an_object_that_has_them_is_a_storage_error(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 416 means "empty" only for an object of no bytes: for any other the
    # server is wrong, or the object changed between two requests, and the
    # read is tried again, then refused, never taken as having no first bytes
    _, _, tree = _big_promoted(s3_url)
    past_the_end = b"range: bytes=%d-%d\r\n" % (1 << 40, (1 << 40) + 1)

    def rewrite(request: bytes) -> bytes:
        return re.sub(rb"(?i)range: bytes=0-65535\r\n", past_the_end, request)

    proxy = CuttingProxy(s3_server.endpoint, after=1 << 40, cuts=0, rewrite=rewrite)
    why = r"reading versions/v000001/model\.safetensors failed: the server answered 416"
    _fails_through(proxy, s3_url, monkeypatch, tree, StorageError, why)
    assert proxy.ranges.count((0, 1 << 16)) == 3  # each try asked for them again


def test_an_object_replaced_between_a_break_and_its_resume_is_an_integrity_error(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, v, tree = _big_promoted(s3_url)
    other = store.put({"w": tree["w"] + 1})
    raw = raw_store(s3_url)
    data = bytes(obstore.get(raw, f"versions/{other}/model.safetensors").bytes())

    def replace() -> None:
        obstore.put(raw, f"versions/{v}/model.safetensors", data)

    proxy = CuttingProxy(s3_server.endpoint, after=5 << 20, cuts=1, on_cut=replace)
    why = f"version {v}: its checkpoint no longer reads: the object was replaced while it was read"
    e = _fails_through(proxy, s3_url, monkeypatch, tree, IntegrityError, why)
    assert isinstance(e, IntegrityError) and e.version == v and proxy.cut == 1
