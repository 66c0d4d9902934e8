"""The scratch buffers of a resharded read: any free buffer large enough is
used again (the smallest such), the free ones never pass the pool's limit in
bytes, and every buffer handed out is aligned and of the shape and dtype
asked for. (The bound end to end, on a bucket load of many shard sizes, is in
tests/store/test_store_bucket_sharded.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from treeguard._src.sharded.scratch import ALIGN, Scratch  # _src: the read's pool is private

F32 = np.dtype(np.float32)


def test_a_smaller_shard_reuses_the_smallest_free_buffer_that_holds_it() -> None:
    pool = Scratch(1 << 20)
    big, mid = pool.take((64, 64), F32, fault=True), pool.take((32, 32), F32, fault=True)
    pool.give(big)
    pool.give(mid)
    got = pool.take((16, 16), F32, fault=False)  # 1 KiB: both hold it, mid is the smaller
    assert got.ctypes.data == mid.ctypes.data and got.shape == (16, 16)
    again = pool.take((48, 48), F32, fault=False)  # only big holds it
    assert again.ctypes.data == big.ctypes.data and pool.held == 0


def test_free_buffers_past_the_limit_are_dropped_smallest_first() -> None:
    pool = Scratch(40 << 10)
    bufs = [pool.take((n << 10,), np.dtype(np.uint8), fault=True) for n in (8, 16, 32)]
    for buf in bufs:
        pool.give(buf)
    assert pool.held == 32 << 10  # 56 KiB given back: the 8 and the 16 dropped
    assert (
        pool.take((20 << 10,), np.dtype(np.uint8), fault=False).ctypes.data == bufs[2].ctypes.data
    )


@given(
    st.lists(
        st.tuples(
            st.integers(1, 300), st.sampled_from(["float32", "int8", "float64"]), st.booleans()
        ),
        max_size=30,
    ),
    st.integers(0, 4096),
)
def test_the_pool_never_keeps_more_than_its_limit(
    steps: list[tuple[int, str, bool]], limit: int
) -> None:
    pool = Scratch(limit)
    out: list[tuple[int, np.ndarray[Any, Any]]] = []
    for mark, (n, name, give) in enumerate(steps, 1):
        dtype = np.dtype(name)
        buf = pool.take((n,), dtype, fault=False)
        assert buf.shape == (n,) and buf.dtype == dtype and buf.ctypes.data % ALIGN == 0
        buf.view(np.uint8)[...] = mark  # writable; no buffer still out shares its bytes
        out.append((mark, buf))
        if give:
            pool.give(out.pop(0)[1])
        assert pool.held <= limit and pool.peak <= limit
    for mark, buf in out:
        assert (buf.view(np.uint8) == mark).all()
